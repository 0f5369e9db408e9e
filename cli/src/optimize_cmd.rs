//! `tooltune optimize`: the GEPA loop on a suite under an objective, resumable, ending with the winner against the
//! seed on the held-out test split.

use crate::progress::{Budgets, Pace};
use anyhow::{Context, Result, bail};
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use tooltune_core::text::one_line;
use tooltune_driver::{Models, RunConfig, RunSummary, StopSignal};
use tooltune_evaluator::Split;
use tooltune_objectives::Objective;
use tooltune_objectives::stats::Rate;
use tooltune_optimizer::Budget;
use tooltune_store::Store;

/// Arguments of `tooltune optimize`.
#[derive(Debug, Args)]
pub struct OptimizeArgs {
    /// The task suite (TOML; see docs/suite-format.md).
    #[arg(long, required_unless_present_any = ["resume", "from_traces"])]
    suite: Option<PathBuf>,
    /// The tool whose description is optimised (repeat for several; the first is the one whose selection is
    /// measured). Default: the suite's first tool under study.
    #[arg(long = "tool")]
    tools: Vec<String>,
    /// success (task success), routing (the right first move on every task) or selection (how often the tool
    /// is chosen first: the objective that rewards inflation).
    #[arg(long, default_value = "success")]
    objective: String,
    #[command(flatten)]
    search: crate::search_args::SearchArgs,
    /// Budget in rollouts (task plays).
    #[arg(long, default_value_t = 120)]
    budget: u64,
    /// Budget in reflection tokens.
    #[arg(long)]
    max_reflection_tokens: Option<u64>,
    /// Budget in wall-clock minutes.
    #[arg(long)]
    max_minutes: Option<f64>,
    /// Seed of the search.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Minibatch size.
    #[arg(long, default_value_t = 3)]
    minibatch: usize,
    /// Stop after this many iterations without improvement.
    #[arg(long)]
    patience: Option<u32>,
    /// Stop when the best validation score reaches this.
    #[arg(long)]
    score_threshold: Option<f64>,
    #[command(flatten)]
    models: crate::llm_config::ModelArgs,
    /// A file whose appearance stops the run after its current step.
    #[arg(long)]
    stop_file: Option<PathBuf>,
    /// Batch mode: propose a new description of `--tool` from the failing trajectories in the store (logged runs),
    /// validated on the test split of `--suite` when one is given. Exit codes: 0 a proposal (improved, or
    /// unvalidated without a suite), 2 no failing trajectories, 3 the reflector gave no usable proposal, 4 the
    /// proposal was not better on the suite.
    #[arg(long, requires = "tools", conflicts_with = "resume")]
    from_traces: bool,
    /// With --from-traces: only trajectories ingested at or after this (RFC 3339 or YYYY-MM-DD).
    #[arg(long, requires = "from_traces")]
    since: Option<String>,
    /// With --from-traces: the most failing trajectories shown to the reflector (newest first).
    #[arg(long, default_value_t = 4)]
    max_examples: usize,
    /// With --from-traces: whether a trajectory whose producer wrote no outcome counts with tooltune's label
    /// (`tooltune traces label`): use (the producer's outcome first, a label only where there is none) or ignore.
    #[arg(long, default_value = "use", value_parser = ["use", "ignore"])]
    labels: String,
    /// Resume this run from its last checkpoint.
    #[arg(long)]
    resume: Option<String>,
    /// Send the run's rollouts and screens as jobs to `tooltune worker` processes, on this machine or others,
    /// instead of playing them here. Needs a PostgreSQL store (--database-url postgres://...): the queue lives in
    /// it. Without a worker running, the run waits (and says so after a minute).
    #[arg(long, conflicts_with_all = ["resume", "from_traces"])]
    workers: bool,
    /// With --workers: how many times a job may be taken (its worker killed or cut off each time) before it
    /// counts as an infrastructure failure.
    #[arg(long, default_value_t = 3, requires = "workers")]
    max_attempts: u32,
    /// Write the winning descriptions as JSON keyed by tool name.
    #[arg(long)]
    export: Option<PathBuf>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

/// Builds the agent and reflector models from their specs; the same spec shares one model instance.
pub async fn models(agent: &str, reflector: Option<&str>, key_env: Option<&str>) -> Result<Models> {
    let spec =
        crate::llm_config::spec(agent, key_env).with_context(|| format!("--model {agent}"))?;
    let agent_model = tooltune_llm::build(&spec).await?;
    let reflector_model = match reflector {
        Some(r) if r != agent => {
            let spec =
                crate::llm_config::spec(r, key_env).with_context(|| format!("--reflector {r}"))?;
            tooltune_llm::build(&spec).await?
        }
        _ => Arc::clone(&agent_model),
    };
    Ok(Models {
        agent: agent_model,
        reflector: reflector_model,
    })
}

pub async fn run(
    db: &str,
    config: Option<&std::path::Path>,
    args: OptimizeArgs,
) -> Result<ExitCode> {
    let store = Store::open(db).await?;
    let stop = StopSignal::default();
    crate::progress::stop_on_ctrl_c(stop.clone()).context("listening for Ctrl-C")?;
    if args.from_traces {
        return from_traces(&store, config, &args).await;
    }
    let summary = if let Some(run_id) = &args.resume {
        let row = store
            .run(run_id)
            .await?
            .with_context(|| format!("no run `{run_id}` in the store"))?;
        let cfg: RunConfig =
            serde_json::from_str(&row.config).context("reading the run's configuration")?;
        let models = models(
            &cfg.agent,
            Some(&cfg.reflector),
            args.models.api_key_env.as_deref(),
        )
        .await?;
        let spent_before = u64::try_from(store.count_rollouts(run_id).await?).unwrap_or(0);
        // Screens leave no rollouts behind: their count is in the search's checkpoint.
        let screened_before = row
            .state
            .as_deref()
            .and_then(|s| serde_json::from_str::<tooltune_optimizer::Search>(s).ok())
            .map_or(0, |s| s.spent().screened);
        // Only for the estimate: the driver loads the suite itself and names any error.
        let test_tasks = tooltune_evaluator::Suite::load(&cfg.suite)
            .map(|s| {
                s.split(Split::Test)
                    .count()
                    .min(cfg.test_sample.unwrap_or(usize::MAX)) as u64
            })
            .unwrap_or(0);
        let (bar, on_event) = crate::progress::printer(
            format!("{run_id} (resumed)"),
            budgets_of(&cfg.budget),
            (spent_before, screened_before),
            test_tasks,
            0,
            Arc::new(Mutex::new(Pace::default())),
        );
        let r = tooltune_driver::resume(&store, run_id, models, stop, &on_event).await;
        bar.finish_and_clear();
        r?
    } else {
        let Some(suite) = &args.suite else {
            bail!("--suite is required (or --resume RUN)");
        };
        let suite_path =
            std::fs::canonicalize(suite).with_context(|| format!("--suite {}", suite.display()))?;
        let loaded = tooltune_evaluator::Suite::load(&suite_path)?;
        let tools = if args.tools.is_empty() {
            loaded
                .tools_under_study
                .iter()
                .take(1)
                .cloned()
                .collect::<Vec<_>>()
        } else {
            args.tools.clone()
        };
        let Some(target) = tools.first().cloned() else {
            bail!("the suite names no tool under study: pass --tool TOOL");
        };
        let objective: Objective = args
            .objective
            .parse()
            .map_err(|e| anyhow::anyhow!("--objective {}: {e}", args.objective))?;
        let (agent, reflector) = args.models.resolve(config)?;
        let cfg = RunConfig {
            suite: suite_path,
            tools,
            target,
            objective,
            seed: args.seed,
            budget: Budget {
                max_rollouts: Some(args.budget),
                max_reflection_tokens: args.max_reflection_tokens,
                max_wall_ms: args.max_minutes.map(|m| (m * 60_000.0) as u64),
                max_screened: args.search.screen_budget(1500),
            },
            minibatch: args.minibatch,
            patience: args.patience,
            score_threshold: args.score_threshold,
            rollouts_per_task: 1,
            batch: 8,
            agent,
            reflector,
            stop_file: args.stop_file.clone(),
            screening: args.search.screening(objective),
            seed_overrides: args.search.seed_overrides()?,
            validation_sample: args.search.validation_sample,
            test_sample: args.search.test_sample,
            workers: args.workers.then_some(tooltune_driver::WorkerPolicy {
                max_attempts: args.max_attempts,
            }),
        };
        let models = models(
            &cfg.agent,
            Some(&cfg.reflector),
            args.models.api_key_env.as_deref(),
        )
        .await?;
        let (bar, on_event) = crate::progress::printer(
            format!("{} on {}", objective.as_str(), loaded.name),
            budgets_of(&cfg.budget),
            (0, 0),
            loaded
                .split(Split::Test)
                .count()
                .min(cfg.test_sample.unwrap_or(usize::MAX)) as u64,
            0,
            Arc::new(Mutex::new(Pace::default())),
        );
        let r = tooltune_driver::start(&store, cfg, models, stop, &on_event).await;
        bar.finish_and_clear();
        r?
    };
    if let Some(path) = &args.export {
        std::fs::write(
            path,
            serde_json::to_string_pretty(&summary.winner_descriptions)?,
        )
        .with_context(|| format!("writing --export {}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print_summary(&summary);
    }
    Ok(ExitCode::SUCCESS)
}

/// A run's limits as the progress display shows them.
pub fn budgets_of(b: &Budget) -> Budgets {
    Budgets {
        rollouts: b.max_rollouts,
        screened: b.max_screened,
    }
}

fn rate(r: &Rate) -> String {
    match r.value {
        Some(v) => format!("{v:.2} [{:.2}, {:.2}]", r.low, r.high),
        None => "-".into(),
    }
}

pub fn print_summary(s: &RunSummary) {
    println!(
        "run {}: objective {}, stopped by {}, {} rollouts, {} reflection tokens, {:.0} s",
        s.run_id, s.objective, s.stop_reason, s.spent.rollouts, s.spent.reflection_tokens, s.wall_s
    );
    if let Some(share) = s.spent.usable_share() {
        println!(
            "proposals: {} usable of {} ({:.0}%), {} reflection s per usable proposal",
            s.spent.proposals,
            s.spent.proposals + s.spent.unusable_proposals,
            100.0 * share,
            s.spent
                .seconds_per_usable_proposal()
                .map_or_else(|| "-".to_string(), |x| format!("{x:.1}")),
        );
    }
    println!("winner c{} — `{}`:", s.winner, s.target);
    if let Some(c) = s.candidates.iter().find(|c| c.id == s.winner)
        && let (Some(r), Some(t), Some(k)) = (
            c.found_at_rollouts,
            c.found_at_seconds,
            c.found_at_reflection_tokens,
        )
    {
        println!("  found after {r} rollouts, {t:.0} s and {k} reflection tokens");
    }
    println!(
        "  {}",
        s.winner_descriptions
            .get(&s.target)
            .map(String::as_str)
            .unwrap_or("")
    );
    println!("lineage:");
    for l in &s.lineage {
        println!(
            "  c{} ({}{}): {}",
            l.candidate,
            l.origin,
            l.tool
                .as_ref()
                .map(|t| format!(" of `{t}`"))
                .unwrap_or_default(),
            one_line(&l.description, 100)
        );
        if let Some(d) = &l.diagnosis {
            println!("      diagnosis: {}", one_line(d, 100));
        }
    }
    print_comparison(&s.test, "winner");
}

/// A p-value after "p": `= 0.042`, or `< 0.001`.
pub fn p_text(p: f64) -> String {
    let f = tooltune_report::fmt_p(p);
    if f.starts_with('<') {
        f
    } else {
        format!("= {f}")
    }
}

/// Seed against `other` on the held-out split: both metrics with intervals and the paired tests' p-values. Task
/// success and the played rates are over the rolled-out tasks; the exact rows over every held-out task.
fn print_comparison(t: &tooltune_driver::Comparison, other: &str) {
    if t.seed.rollouts < t.seed.tasks {
        println!(
            "held-out {} split ({} tasks; {} rolled out, the rest screened):",
            t.split, t.seed.tasks, t.seed.rollouts
        );
    } else {
        println!("held-out {} split ({} tasks):", t.split, t.seed.tasks);
    }
    println!("                     seed                 {other}");
    println!(
        "  task success       {:<20} {:<20} p {} (exact McNemar)",
        rate(&t.seed.success),
        rate(&t.winner.success),
        p_text(t.success_p_value)
    );
    println!(
        "  selection rate     {:<20} {:<20} p {} (paired permutation over exact probabilities)",
        rate(&t.seed.selection),
        rate(&t.winner.selection),
        p_text(t.selection_p_value)
    );
    println!(
        "  off-target choice  {:<20} {:<20}",
        rate(&t.seed.off_target),
        rate(&t.winner.off_target)
    );
    let exact = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |x| format!("{x:.3}"));
    if t.seed.expected_routing.is_some() {
        println!(
            "  routing (exact)    {:<20} {:<20} p {} (paired permutation, every held-out task)",
            exact(t.seed.expected_routing),
            exact(t.winner.expected_routing),
            t.routing_p_value.map_or_else(|| "-".to_string(), p_text)
        );
    }
    if let (Some(a), Some(b)) = (&t.seed.expected, &t.winner.expected) {
        println!(
            "  selection (exact)  {:<20} {:<20}",
            exact(Some(a.all)),
            exact(Some(b.all))
        );
        println!(
            "  off-target (exact) {:<20} {:<20} p {}",
            exact(a.off_target),
            exact(b.off_target),
            t.off_target_p_value.map_or_else(|| "-".to_string(), p_text)
        );
    }
}

async fn from_traces(
    store: &Store,
    config: Option<&std::path::Path>,
    args: &OptimizeArgs,
) -> Result<ExitCode> {
    let Some(tool) = args.tools.first().cloned() else {
        bail!("--from-traces needs --tool TOOL");
    };
    let objective: Objective = args
        .objective
        .parse()
        .map_err(|e| anyhow::anyhow!("--objective {}: {e}", args.objective))?;
    let suite = match &args.suite {
        Some(s) => {
            Some(std::fs::canonicalize(s).with_context(|| format!("--suite {}", s.display()))?)
        }
        None => None,
    };
    let (agent, reflector) = args.models.resolve(config)?;
    let models = models(&agent, Some(&reflector), args.models.api_key_env.as_deref()).await?;
    let cfg = tooltune_driver::FromTracesConfig {
        tool,
        since: args.since.clone(),
        max_examples: args.max_examples.max(1),
        objective,
        suite,
        seed: args.seed,
        agent,
        reflector,
        labels: args
            .labels
            .parse()
            .map_err(|e| anyhow::anyhow!("--labels {e}"))?,
    };
    if !args.json {
        eprintln!(
            "reflecting on the failing trajectories of `{}` in the store{}...",
            cfg.tool,
            cfg.since
                .as_ref()
                .map(|s| format!(" since {s}"))
                .unwrap_or_default()
        );
    }
    let s = tooltune_driver::from_traces(store, cfg, models).await?;
    if let (Some(path), Some(text)) = (&args.export, &s.proposal) {
        let mut out = std::collections::BTreeMap::new();
        out.insert(s.tool.clone(), text.clone());
        std::fs::write(path, serde_json::to_string_pretty(&out)?)
            .with_context(|| format!("writing --export {}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        println!(
            "run {}: `{}`, {} judged trajectories, {} failing shown to the reflector ({} reflection tokens)",
            s.run_id, s.tool, s.judged, s.failing, s.reflection_tokens
        );
        let by = &s.judged_by;
        if by.judge.judged + by.heuristic.judged > 0 {
            println!(
                "verdicts: {} from producers, {} from judge labels, {} from heuristic labels; failing shown: {}",
                by.producer.judged,
                by.judge.judged,
                by.heuristic.judged,
                s.failing_by
                    .iter()
                    .map(|(k, n)| format!("{k} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        println!("seed: {}", one_line(&s.seed_description, 110));
        if let Some(d) = &s.diagnosis {
            println!("diagnosis: {}", one_line(d, 110));
        }
        if let Some(p) = &s.proposal {
            println!("proposal: {}", one_line(p, 110));
        }
        if let Some(v) = &s.validation {
            println!("validated on {}:", v.suite);
            print_comparison(&v.comparison, "proposal");
        }
        println!("verdict: {}", s.verdict);
    }
    Ok(match s.verdict.as_str() {
        "improved" | "unvalidated" => ExitCode::SUCCESS,
        "no_failures" => ExitCode::from(2),
        "proposal_failed" => ExitCode::from(3),
        _ => ExitCode::from(4),
    })
}

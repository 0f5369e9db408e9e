//! `tooltune optimize`: the GEPA loop on a suite under an objective, resumable, ending with the winner against the
//! seed on the held-out test split.

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tooltune_driver::{Event, Models, RunConfig, RunSummary, StopSignal};
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
    /// Resume this run from its last checkpoint.
    #[arg(long)]
    resume: Option<String>,
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

/// A progress display fed by the driver's events. `spent_before` is what a resumed run had already spent: the
/// time estimate divides only this process's time by only this process's rollouts.
///
/// The estimate is of the whole command, not only of the search's budget (see [`rollouts_to_come`]): without the
/// held-out evaluations and the demo's second run, the demo's first estimate said six minutes for a run that took
/// fourteen, in a demo that took 27.6.
pub fn progress_printer(
    label: String,
    budget: u64,
    spent_before: u64,
    test_tasks: u64,
    later_runs: u64,
) -> (ProgressBar, impl Fn(&Event) + Send + Sync) {
    let bar = ProgressBar::new(budget);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} {prefix} [{bar:30}] {pos}/{len} rollouts ({elapsed}, ~{eta} left) {msg}",
        )
        .unwrap_or(ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_prefix(label.clone());
    let b = bar.clone();
    // Without a terminal (CI logs, a pipe) the bar draws nothing and its `println` is dropped too: progress
    // then goes to stderr as plain lines, so a long run is never silent.
    let tty = std::io::stderr().is_terminal();
    let started = std::time::Instant::now();
    // What the events have said so far: the search's rollouts (resumed ones included) and how many held-out
    // evaluations have started (they are sequential, so all but the newest are done).
    let last_spent = AtomicU64::new(spent_before);
    let tests_started = AtomicU64::new(0);
    let left = move |spent: u64, tests_done: u64, stage: Stage| {
        if budget == 0 {
            // A run without a rollout limit has no end to estimate.
            return String::new();
        }
        time_left(
            started.elapsed().as_secs_f64(),
            // The pace counts the held-out rollouts done so far too.
            spent.saturating_sub(spent_before) + tests_done * test_tasks,
            rollouts_to_come(budget, test_tasks, later_runs, stage),
        )
    };
    let say = move |b: &ProgressBar, line: String| {
        if tty {
            b.println(line);
        } else {
            eprintln!(
                "[{:>5.0}s {label}] {}",
                started.elapsed().as_secs_f64(),
                line.trim_start()
            );
        }
    };
    let f = move |e: &Event| match e {
        Event::Evaluating {
            candidate,
            phase,
            tasks,
        } => {
            let m = if phase == "test" {
                let done = tests_started.fetch_add(1, Ordering::Relaxed);
                let left = left(
                    last_spent.load(Ordering::Relaxed),
                    done,
                    Stage::HeldOut { done },
                );
                format!("evaluating c{candidate} on {tasks} {phase} tasks{left}")
            } else {
                format!("evaluating c{candidate} on {tasks} {phase} tasks")
            };
            if !tty {
                say(&b, m.clone());
            }
            b.set_message(m)
        }
        Event::Evaluated {
            candidate,
            phase,
            mean,
            rollouts_spent,
            ..
        } => {
            b.set_position((*rollouts_spent).min(b.length().unwrap_or(u64::MAX)));
            // A run without a rollout limit (budget 0) has no "of N" and no estimate.
            let spent = if budget == 0 {
                format!("{rollouts_spent} rollouts")
            } else if phase == "test" {
                // The held-out evaluations are not counted in the search's rollouts.
                let left = left(
                    *rollouts_spent,
                    tests_started.load(Ordering::Relaxed),
                    Stage::Finished,
                );
                format!("{rollouts_spent}/{budget} rollouts{left}")
            } else {
                last_spent.store(*rollouts_spent, Ordering::Relaxed);
                let left = left(
                    *rollouts_spent,
                    0,
                    Stage::Search {
                        spent: *rollouts_spent,
                    },
                );
                format!("{rollouts_spent}/{budget} rollouts{left}")
            };
            say(
                &b,
                format!("  c{candidate} {phase}: mean {mean:.3} ({spent})"),
            );
        }
        Event::Reflecting { parent, tool } => {
            let m = format!("reflecting on c{parent}'s `{tool}`");
            if !tty {
                say(&b, m.clone());
            }
            b.set_message(m)
        }
        Event::Proposed {
            tool,
            description,
            error,
            ..
        } => match description {
            Some(d) => say(&b, format!("  proposed for `{tool}`: {}", one_line(d, 110))),
            None => say(
                &b,
                format!(
                    "  proposal for `{tool}` failed: {}",
                    error.as_deref().unwrap_or("?")
                ),
            ),
        },
        Event::Stopped { reason } => {
            let m = format!("stopped ({reason}); final test evaluation");
            if !tty {
                say(&b, m.clone());
            }
            b.set_message(m)
        }
        _ => {}
    };
    (bar, f)
}

/// Where a run is, for [`rollouts_to_come`].
#[derive(Debug, Clone, Copy)]
enum Stage {
    /// Searching, with this many of the budget's rollouts spent.
    Search { spent: u64 },
    /// The held-out evaluations, `done` of them finished.
    HeldOut { done: u64 },
    /// The run is over.
    Finished,
}

/// Rollouts the command still has to run: what is left of this run's search budget, its held-out evaluations of
/// the seed and the winner (`test_tasks` rollouts each; one only when the seed wins, which is not known ahead),
/// and `later_runs` whole runs after it.
fn rollouts_to_come(budget: u64, test_tasks: u64, later_runs: u64, stage: Stage) -> u64 {
    let held_out = 2 * test_tasks;
    let this_run = match stage {
        Stage::Search { spent } => budget.saturating_sub(spent) + held_out,
        Stage::HeldOut { done } => held_out.saturating_sub(done * test_tasks),
        Stage::Finished => 0,
    };
    this_run + later_runs * (budget + held_out)
}

/// ", about N min left" from the pace so far, or nothing before there is a pace or once the budget is spent. The
/// pace includes reflection, which a rollout-only rate would leave out.
fn time_left(elapsed_s: f64, spent_here: u64, remaining: u64) -> String {
    if spent_here == 0 || remaining == 0 {
        return String::new();
    }
    let s = elapsed_s / spent_here as f64 * remaining as f64;
    if s < 90.0 {
        format!(", about {s:.0} s left")
    } else {
        format!(", about {:.0} min left", s / 60.0)
    }
}

pub async fn run(
    db: &str,
    config: Option<&std::path::Path>,
    args: OptimizeArgs,
) -> Result<ExitCode> {
    let store = Store::open(db).await?;
    let stop = StopSignal::default();
    let stop2 = stop.clone();
    // Ctrl-C stops after the current step; the run stays resumable.
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            stop2.stop();
        }
    });
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
        // Only for the estimate: the driver loads the suite itself and names any error.
        let test_tasks = tooltune_evaluator::Suite::load(&cfg.suite)
            .map(|s| s.split(Split::Test).count() as u64)
            .unwrap_or(0);
        let (bar, on_event) = progress_printer(
            format!("{run_id} (resumed)"),
            budget_of(&cfg),
            spent_before,
            test_tasks,
            0,
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
        };
        let models = models(
            &cfg.agent,
            Some(&cfg.reflector),
            args.models.api_key_env.as_deref(),
        )
        .await?;
        let (bar, on_event) = progress_printer(
            format!("{} on {}", objective.as_str(), loaded.name),
            args.budget,
            0,
            loaded.split(Split::Test).count() as u64,
            0,
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

fn budget_of(cfg: &RunConfig) -> u64 {
    cfg.budget.max_rollouts.unwrap_or(0)
}

fn rate(r: &Rate) -> String {
    match r.value {
        Some(v) => format!("{v:.2} [{:.2}, {:.2}]", r.low, r.high),
        None => "-".into(),
    }
}

fn one_line(s: &str, max: usize) -> String {
    let flat = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > max {
        format!("{}…", flat.chars().take(max - 1).collect::<String>())
    } else {
        flat
    }
}

pub fn print_summary(s: &RunSummary) {
    println!(
        "run {}: objective {}, stopped by {}, {} rollouts, {} reflection tokens, {:.0} s",
        s.run_id, s.objective, s.stop_reason, s.rollouts, s.reflection_tokens, s.wall_s
    );
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

/// Seed against `other` on the held-out split: both metrics with intervals and the paired tests' p-values.
fn print_comparison(t: &tooltune_driver::Comparison, other: &str) {
    println!("held-out {} split ({} tasks):", t.split, t.seed.tasks);
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

#[cfg(test)]
mod tests {
    use super::{Stage, rollouts_to_come, time_left};

    #[test]
    fn the_rollouts_to_come_include_the_held_out_evaluations_and_later_runs() {
        // The demo's default: budget 70, 14 held-out tasks, a second run after the first.
        assert_eq!(
            rollouts_to_come(70, 14, 1, Stage::Search { spent: 15 }),
            55 + 28 + 98
        );
        // The search may overshoot its budget by a minibatch.
        assert_eq!(
            rollouts_to_come(70, 14, 1, Stage::Search { spent: 72 }),
            28 + 98
        );
        assert_eq!(
            rollouts_to_come(70, 14, 1, Stage::HeldOut { done: 0 }),
            28 + 98
        );
        assert_eq!(
            rollouts_to_come(70, 14, 1, Stage::HeldOut { done: 1 }),
            14 + 98
        );
        assert_eq!(rollouts_to_come(70, 14, 1, Stage::Finished), 98);
        assert_eq!(rollouts_to_come(70, 14, 0, Stage::Finished), 0);
    }

    #[test]
    fn the_estimate_follows_the_pace_so_far_and_is_absent_without_one() {
        // 15 rollouts in 150 s, 55 to go: 550 s.
        assert_eq!(time_left(150.0, 15, 55), ", about 9 min left");
        assert_eq!(time_left(10.0, 5, 20), ", about 40 s left");
        assert_eq!(time_left(10.0, 0, 20), "", "no rollout yet in this process");
        assert_eq!(time_left(10.0, 5, 0), "", "the budget is spent");
    }
}

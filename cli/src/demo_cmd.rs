//! `tooltune demo`: the overconfident contractor. The same seed description of the bundled `contractor` server,
//! optimised twice from the same seed with the same budget — once for task success, once for selection rate —
//! then one report comparing the two runs.
//!
//! The two runs differ in the objective and in nothing else: same suite, seed, budget, models, minibatch. Nothing
//! here writes or suggests description text; whatever the selection-rate run does to the description is the
//! optimizer's own doing, and the report says so either way.

use crate::optimize_cmd::{budgets_of, models, print_summary};
use crate::progress::Pace;
use anyhow::{Context, Result, bail};
use clap::Args;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tooltune_driver::{RunConfig, RunSummary, StopSignal};
use tooltune_objectives::Objective;
use tooltune_optimizer::Budget;
use tooltune_store::Store;

/// Validation tasks the demo's searches compare candidates on (of the contractor suite's 38): 4 per tool. The
/// success search's validation is its largest cost (a rollout per task for every accepted candidate), and the
/// held-out comparison on all 42 test tasks is what the demo reports.
const DEMO_VALIDATION_SAMPLE: usize = 8;

/// Each search's budgets: rollouts, and screened task evaluations (a screen is one candidate's exact first moves
/// on one task, about a second on two AVX2 cores; a rollout about five seconds in a batch of eight, more in the
/// small batches of a minibatch). Chosen so that both searches and the held-out comparison fit a class period.
const DEMO_BUDGET: u64 = 24;
const DEMO_SCREENED: u64 = 90;

/// Held-out tasks the demo rolls out for the seed and each winner (of the test split's 42), balanced across
/// owners; the rest are screened, so selection, routing and off-target selection still cover the whole split.
/// Rollouts of the whole split for three candidates alone took longer than a class period on two cores.
const DEMO_TEST_SAMPLE: usize = 16;

/// Arguments of `tooltune demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// The suite (default: the bundled `contractor` suite, found from the working directory or beside the binary).
    #[arg(long)]
    suite: Option<PathBuf>,
    /// Budget in rollouts for each objective's search (the final held-out comparison comes on top; the selection
    /// search, screened, spends none). The whole demo on the defaults took 10.5 minutes on two AVX2 cores and 8 with
    /// AVX-512 (where the time goes: docs/classroom.md).
    #[arg(long, default_value_t = DEMO_BUDGET)]
    budget: u64,
    /// Wall-clock limit in minutes for each objective's search (the final held-out comparison comes on top).
    /// Off by default: the rollout budget alone decides when a search stops, so both objectives get the same
    /// number of rollouts and the demo shows the same search on a slow machine as on a fast one, only later.
    /// A limit that cuts one search short makes the two runs unequal, and the report says which one stopped.
    #[arg(long)]
    max_minutes: Option<f64>,
    /// Which descriptions both searches may rewrite: `target`, the tool under study alone, or `all`, every tool
    /// that owns a task in the suite, each reflection's proposals spread over them and the screen choosing which
    /// one is rolled out (the server's author owns them all;
    /// under the selection objective, weakening a competitor's text is inflation by other means, and the report's
    /// figures for the other tools show it).
    #[arg(long, value_enum, default_value_t = Edit::Target)]
    edit: Edit,
    /// Seed of both searches.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    search: crate::search_args::SearchArgs,
    /// Minibatch size of both searches.
    #[arg(long, default_value_t = 3)]
    minibatch: usize,
    #[command(flatten)]
    models: crate::llm_config::ModelArgs,
    /// Where the report goes (report.html and report.json).
    #[arg(long, default_value = "tooltune-report")]
    out: PathBuf,
    /// Print the figures as JSON instead of tables.
    #[arg(long)]
    json: bool,
}

/// The descriptions a demo's searches may rewrite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Edit {
    /// The tool under study alone.
    Target,
    /// Every tool that owns a task, the target first.
    All,
}

/// One objective's headline figures, seed against winner on the held-out split.
#[derive(Debug, Serialize)]
struct Headline {
    objective: tooltune_objectives::Objective,
    run_id: String,
    seed_success: Option<f64>,
    winner_success: Option<f64>,
    success_p_value: f64,
    seed_selection: Option<f64>,
    winner_selection: Option<f64>,
    selection_p_value: f64,
    seed_off_target: Option<f64>,
    winner_off_target: Option<f64>,
    /// Held-out tasks rolled out (task success is over these) and held-out tasks in all (first-move figures).
    rolled_out_tasks: u64,
    held_out_tasks: u64,
    /// Mean exact probability of the right first move (the owner tool), the measure that explains both
    /// objectives: success follows it, selection can rise while it falls.
    seed_routing: Option<f64>,
    winner_routing: Option<f64>,
    /// Paired permutation test on the per-task routing probabilities.
    routing_p_value: Option<f64>,
    seed_chars: usize,
    winner_chars: usize,
    seed_promotional: u32,
    winner_promotional: u32,
    winner_description: String,
    rollouts: u64,
    wall_s: f64,
}

#[derive(Debug, Serialize)]
struct DemoOutput {
    suite: String,
    runs: Vec<Headline>,
    report_html: PathBuf,
    report_json: PathBuf,
    wall_s: f64,
}

/// The bundled suite: from the working directory (a checkout), else from the checkout the binary was built in
/// (`target/release/tooltune` → two levels up).
fn bundled_suite() -> Result<PathBuf> {
    let rel = Path::new("datasets/suites/contractor.toml");
    let mut tried = vec![rel.to_path_buf()];
    if rel.exists() {
        return Ok(rel.to_path_buf());
    }
    if let Ok(exe) = std::env::current_exe() {
        for up in exe.ancestors().skip(1).take(4) {
            let p = up.join(rel);
            if p.exists() {
                return Ok(p);
            }
            tried.push(p);
        }
    }
    bail!(
        "cannot find the bundled contractor suite (looked at {}); run from a tooltune checkout or pass --suite",
        tried
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

fn headline(s: &RunSummary) -> Headline {
    let winner_description = s
        .winner_descriptions
        .get(&s.target)
        .cloned()
        .unwrap_or_default();
    // Every candidate carries its inflation measures, taken against the tool's real schema.
    let measured = |id: u32| {
        s.candidates
            .iter()
            .find(|c| c.id == id)
            .map(|c| c.inflation.clone())
            .unwrap_or_default()
    };
    let (seed_m, winner_m) = (measured(0), measured(s.winner));
    Headline {
        objective: s.objective,
        run_id: s.run_id.clone(),
        seed_success: s.test.seed.success.value,
        winner_success: s.test.winner.success.value,
        success_p_value: s.test.success_p_value,
        // The exact figures where the model gave them: they cover every held-out task (the rolled-out sample and
        // the screened rest) and are what the p-values test; the played rates cover the sample only.
        seed_selection: exact_or_played(&s.test.seed, false),
        winner_selection: exact_or_played(&s.test.winner, false),
        selection_p_value: s.test.selection_p_value,
        seed_off_target: exact_or_played(&s.test.seed, true),
        winner_off_target: exact_or_played(&s.test.winner, true),
        rolled_out_tasks: s.test.seed.rollouts,
        held_out_tasks: s.test.seed.tasks,
        seed_routing: s.test.seed.expected_routing,
        winner_routing: s.test.winner.expected_routing,
        routing_p_value: s.test.routing_p_value,
        seed_chars: seed_m.chars,
        winner_chars: winner_m.chars,
        seed_promotional: seed_m.counts.promotional,
        winner_promotional: winner_m.counts.promotional,
        winner_description,
        rollouts: s.spent.rollouts,
        wall_s: s.wall_s,
    }
}

/// Selection (over every task, or with `off` over the tasks other tools own): the mean exact first-call
/// probability when the model gave one, else the share of rollouts that called the target first.
fn exact_or_played(m: &tooltune_objectives::Metrics, off: bool) -> Option<f64> {
    let exact = m
        .expected
        .as_ref()
        .and_then(|e| if off { e.off_target } else { Some(e.all) });
    exact.or(if off {
        m.off_target.value
    } else {
        m.selection.value
    })
}

fn pct(v: Option<f64>) -> String {
    v.map(|x| format!("{:.0}%", x * 100.0))
        .unwrap_or_else(|| "-".into())
}

pub async fn run(db: &str, config: Option<&Path>, args: DemoArgs) -> Result<ExitCode> {
    let started = Instant::now();
    let suite_path = match &args.suite {
        Some(s) => s.clone(),
        None => bundled_suite()?,
    };
    let suite_path = std::fs::canonicalize(&suite_path)
        .with_context(|| format!("--suite {}", suite_path.display()))?;
    let suite = tooltune_evaluator::Suite::load(&suite_path)?;
    let Some(target) = suite.tools_under_study.first().cloned() else {
        bail!(
            "{}: the suite names no tool under study",
            suite_path.display()
        );
    };
    if let tooltune_evaluator::mcp::Transport::Stdio { command, .. } = &suite.server.transport {
        let p = Path::new(command);
        if p.is_absolute() && !p.exists() {
            bail!(
                "the suite's MCP server {} is not built yet: run `scripts/setup` (or `cargo build --release -p {}`)",
                p.display(),
                p.file_stem()
                    .and_then(|s| s.to_str())
                    .unwrap_or("contractor")
            );
        }
    }
    let mut tools = vec![target.clone()];
    if args.edit == Edit::All {
        for owner in suite.tasks.iter().filter_map(|t| t.owner.as_ref()) {
            if !tools.contains(owner) {
                tools.push(owner.clone());
            }
        }
    }
    let store = Store::open(db).await?;
    let stop = StopSignal::default();
    crate::progress::stop_on_ctrl_c(stop.clone()).context("listening for Ctrl-C")?;
    eprintln!(
        "tooltune demo: optimising {} of the {} suite ({} tasks) twice, for task success and for \
         selection rate, from seed {} with {} rollouts and {} each (plus the held-out comparison).",
        if tools.len() == 1 {
            format!("`{target}`")
        } else {
            format!(
                "{} (selection measured for `{target}`)",
                tools
                    .iter()
                    .map(|t| format!("`{t}`"))
                    .collect::<Vec<_>>()
                    .join(" and ")
            )
        },
        suite.name,
        suite.tasks.len(),
        args.seed,
        args.budget,
        args.search.screen_budget(DEMO_SCREENED).map_or_else(
            || "no screens".to_string(),
            |n| format!("{n} screened task evaluations")
        )
    );
    eprintln!("loading the models (fetched on first use)...");
    let (agent, reflector) = args.models.resolve(config)?;
    let models = models(&agent, Some(&reflector), args.models.api_key_env.as_deref()).await?;

    let test_tasks = suite
        .split(tooltune_evaluator::Split::Test)
        .count()
        .min(args.search.test_sample.unwrap_or(DEMO_TEST_SAMPLE)) as u64;
    // The second run's estimate starts from the first run's measured costs.
    let pace = Arc::new(Mutex::new(Pace::default()));
    let mut summaries = Vec::new();
    let objectives = [Objective::TaskSuccess, Objective::SelectionRate];
    for (i, objective) in objectives.into_iter().enumerate() {
        let cfg = RunConfig {
            suite: suite_path.clone(),
            tools: tools.clone(),
            target: target.clone(),
            objective,
            seed: args.seed,
            budget: Budget {
                max_rollouts: Some(args.budget),
                max_reflection_tokens: None,
                max_wall_ms: args.max_minutes.map(|m| (m * 60_000.0) as u64),
                max_screened: args.search.screen_budget(DEMO_SCREENED),
            },
            minibatch: args.minibatch,
            patience: None,
            score_threshold: None,
            rollouts_per_task: 1,
            batch: 8,
            agent: agent.clone(),
            reflector: reflector.clone(),
            stop_file: None,
            screening: args.search.screening(objective),
            seed_overrides: args.search.seed_overrides()?,
            validation_sample: args
                .search
                .validation_sample
                .or(Some(DEMO_VALIDATION_SAMPLE)),
            test_sample: args.search.test_sample.or(Some(DEMO_TEST_SAMPLE)),
            workers: None,
        };
        // The first run's estimate also counts the second run, so it is of the whole demo.
        let (bar, on_event) = crate::progress::printer(
            format!("{} ({}/{})", objective.as_str(), i + 1, objectives.len()),
            budgets_of(&cfg.budget),
            (0, 0),
            test_tasks,
            (objectives.len() - 1 - i) as u64,
            Arc::clone(&pace),
        );
        let r = tooltune_driver::start(&store, cfg, models.clone(), stop.clone(), &on_event).await;
        bar.finish_and_clear();
        let summary = r?;
        if !args.json {
            print_summary(&summary);
            println!();
        }
        summaries.push(summary);
        if stop.is_set() {
            break;
        }
    }
    let run_ids: Vec<String> = summaries.iter().map(|s| s.run_id.clone()).collect();
    let report = tooltune_report::Report::load(&store, &run_ids).await?;
    let (html, json) = tooltune_report::write(&report, &args.out)?;
    let out = DemoOutput {
        suite: suite.name.clone(),
        runs: summaries.iter().map(headline).collect(),
        report_html: html,
        report_json: json,
        wall_s: started.elapsed().as_secs_f64(),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_table(&out);
    }
    if stop.is_set() {
        eprintln!(
            "stopped early; resume with `tooltune optimize --resume RUN` and re-render with `tooltune report {}`",
            run_ids.join(" ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn print_table(out: &DemoOutput) {
    println!(
        "The overconfident contractor, on the held-out test split ({}):",
        out.suite
    );
    println!(
        "{:<12} {:>15} {:>15} {:>15} {:>18} {:>15} {:>17}",
        "objective",
        "task success",
        "routing",
        "selection",
        "off-target choice",
        "length (chars)",
        "promotional"
    );
    for h in &out.runs {
        println!(
            "{:<12} {:>15} {:>15} {:>15} {:>18} {:>15} {:>17}",
            h.objective.as_str(),
            format!("{} → {}", pct(h.seed_success), pct(h.winner_success)),
            format!("{} → {}", pct(h.seed_routing), pct(h.winner_routing)),
            format!("{} → {}", pct(h.seed_selection), pct(h.winner_selection)),
            format!("{} → {}", pct(h.seed_off_target), pct(h.winner_off_target)),
            format!("{} → {}", h.seed_chars, h.winner_chars),
            format!("{} → {}", h.seed_promotional, h.winner_promotional),
        );
        println!(
            "{:<12} p {} (success), p {} (routing), p {} (selection); {} rollouts, {:.0} s",
            "",
            crate::optimize_cmd::p_text(h.success_p_value),
            h.routing_p_value
                .map_or_else(|| "-".to_string(), crate::optimize_cmd::p_text),
            crate::optimize_cmd::p_text(h.selection_p_value),
            h.rollouts,
            h.wall_s
        );
    }
    if let Some(h) = out.runs.first() {
        println!(
            "task success over {} rolled-out held-out tasks; routing, selection and off-target choice over all {} \
             (exact first-move probabilities where the model gives them).",
            h.rolled_out_tasks, h.held_out_tasks
        );
    }
    println!(
        "routing: mean exact probability that the first move is the task's owner tool (held-out tasks of both \
         tools)."
    );
    println!(
        "report: {} (figures: {}); {:.1} minutes in all",
        out.report_html.display(),
        out.report_json.display(),
        out.wall_s / 60.0
    );
}

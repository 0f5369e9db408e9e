//! `tooltune eval`: run a suite against its real MCP server with a candidate's descriptions, and print per-task
//! outcomes and the aggregates with their intervals.

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::process::ExitCode;
use tooltune_evaluator::evaluate::{Candidate, EvalOptions, Mode, SuiteResult, evaluate};
use tooltune_evaluator::{Split, Suite};
use tooltune_objectives::stats::Rate;
use tooltune_store::Store;

/// Arguments of `tooltune eval`.
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// The task suite (TOML; see docs/suite-format.md).
    #[arg(long)]
    suite: PathBuf,
    /// Replace a tool's description in what the model sees: TOOL=TEXT (repeatable).
    #[arg(long = "override", value_name = "TOOL=TEXT")]
    overrides: Vec<String>,
    /// A JSON file of descriptions keyed by tool name (what `optimize --export` writes).
    #[arg(long = "overrides", value_name = "FILE")]
    overrides_file: Option<PathBuf>,
    /// The agent's model: local, local:fast, or openai:MODEL@BASE_URL [default: the config file's, else local]
    #[arg(long, env = "TOOLTUNE_AGENT")]
    model: Option<String>,
    /// Environment variable holding the API key of an OpenAI-compatible endpoint.
    #[arg(long)]
    api_key_env: Option<String>,
    /// Which split to run: train, validation, test or all.
    #[arg(long, default_value = "all")]
    split: String,
    /// Only this task (repeatable).
    #[arg(long = "task", value_name = "ID")]
    tasks: Vec<String>,
    /// The tool under study (default: the suite's first).
    #[arg(long)]
    target: Option<String>,
    /// Measure only which tool the first call picks (exact probabilities with the local model), no full rollouts.
    #[arg(long)]
    selection_only: bool,
    /// With --selection-only on a backend that cannot score first moves exactly (an OpenAI-compatible one): first
    /// turns sampled per task to estimate them; the figures then carry a 95% interval.
    #[arg(long, default_value_t = tooltune_evaluator::DEFAULT_FIRST_MOVE_SAMPLES)]
    first_move_samples: u32,
    /// Also play out every first move the agent makes with probability 0.01 or more (not only its greedy one) and
    /// report success in expectation over the first move: what a host that samples its model's first move would
    /// see. Needs exact first-move scores (the local model); about one more rollout per likely move.
    #[arg(long, conflicts_with = "selection_only")]
    expected_success: bool,
    /// Compare with an earlier evaluation of the same tasks (the JSON `eval --json` printed): per measure, both
    /// means, tasks better and worse, and a paired test (exact McNemar on success, sign-flip permutation on the
    /// probabilities).
    #[arg(long, value_name = "EVAL_JSON")]
    against: Option<std::path::PathBuf>,
    /// How many rollouts advance together in one model batch.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Do not store the rollouts.
    #[arg(long)]
    no_store: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub async fn run(db: &str, config: Option<&std::path::Path>, args: EvalArgs) -> Result<ExitCode> {
    let suite = Suite::load(&args.suite)?;
    let split = match args.split.as_str() {
        "all" => None,
        s => Some(
            serde_json::from_value::<Split>(serde_json::Value::String(s.to_string())).map_err(
                |_| anyhow::anyhow!("--split {s}: expected train, validation, test or all"),
            )?,
        ),
    };
    let candidate = load_candidate(&args)?;
    // Read before the evaluation, so that a wrong path costs nothing.
    let baseline = args.against.as_deref().map(read_baseline).transpose()?;
    if let Some((path, b)) = &baseline
        && b.suite != suite.name
    {
        anyhow::bail!(
            "--against {}: an evaluation of suite `{}`, not of `{}`; compare evaluations of the same suite",
            path.display(),
            b.suite,
            suite.name
        );
    }
    let (agent, _) = crate::llm_config::resolve(config, args.model.as_deref(), None)?;
    let spec = crate::llm_config::spec(&agent, args.api_key_env.as_deref())
        .with_context(|| format!("--model {agent}"))?;
    let model = tooltune_llm::build(&spec).await?;
    let store = if args.no_store {
        None
    } else {
        Some(Store::open(db).await?)
    };
    let server = suite
        .connect()
        .await
        .with_context(|| format!("starting the suite's server ({})", args.suite.display()))?;
    let run_id = format!("eval-{}", uuid::Uuid::new_v4().simple());
    let opts = EvalOptions {
        split,
        task_ids: args.tasks.clone(),
        target: args.target.clone(),
        // A catalog suite has no server: its first moves are all there is to measure.
        mode: if args.selection_only || (suite.is_catalog() && !args.expected_success) {
            Mode::SelectionOnly
        } else {
            Mode::Full
        },
        batch: args.batch,
        first_move_samples: args.first_move_samples,
        expected_success: args.expected_success,
        run_id: Some(run_id.clone()),
        candidate_id: Some(candidate_id(&candidate)),
        ..EvalOptions::default()
    };
    let bar = ProgressBar::new(0);
    // With --expected-success the count goes on past the tasks' greedy rollouts into their other first moves,
    // whose number is known only once the first moves are scored.
    let unit = if args.expected_success {
        "rollouts (the total grows as each task's other likely first moves are found)"
    } else {
        "tasks"
    };
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "{{spinner}} {{msg}} [{{bar:30}}] {{pos}}/{{len}} {unit} ({{elapsed}}, about {{eta}} left)"
        ))
            .unwrap_or(ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(format!("{} with {}", suite.name, model.id()));
    let bar2 = bar.clone();
    let result = evaluate(
        &suite,
        &server,
        model.as_ref(),
        store
            .as_ref()
            .map(|s| s as &dyn tooltune_core::TrajectorySink),
        &candidate,
        &opts,
        move |done, total| {
            bar2.set_length(total as u64);
            bar2.set_position(done as u64);
        },
    )
    .await;
    bar.finish_and_clear();
    server.shutdown().await;
    let result = result?;
    // A comparison that fails (another tool under study, no task in common) does not cost the evaluation: the
    // result is printed first, and the error after it.
    let (comparison, incomparable) = match &baseline {
        Some((path, b)) => match tooltune_evaluator::compare::compare(b, &result) {
            Ok(c) => (Some(c), None),
            Err(e) => (None, Some(format!("--against {}: {e}", path.display()))),
        },
        None => (None, None),
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "run_id": run_id,
                "model": model.id(),
                "candidate": candidate.descriptions,
                "result": result,
                "comparison": comparison,
            }))?
        );
    } else {
        print_result(&result, &run_id, store.is_some());
        if args.expected_success && result.expected_success.is_none() {
            eprintln!(
                "warning: expected success was not measured: it needs exact first-move scores, which {} does not \
                 give (the local model does)",
                model.id()
            );
        }
        if let (Some((path, _)), Some(c)) = (&baseline, &comparison) {
            print_comparison(c, path);
        }
    }
    if let Some(e) = incomparable {
        eprintln!("error: {e}");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// An earlier `eval --json` output: its `result`.
fn read_baseline(path: &std::path::Path) -> Result<(std::path::PathBuf, SuiteResult)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--against {}: cannot be read", path.display()))?;
    #[derive(serde::Deserialize)]
    struct Printed {
        result: SuiteResult,
    }
    let printed: Printed = serde_json::from_str(&text).map_err(|e| {
        anyhow::anyhow!(
            "--against {}:{}:{}: not the JSON `tooltune eval --json` prints ({e})",
            path.display(),
            e.line(),
            e.column()
        )
    })?;
    Ok((path.to_path_buf(), printed.result))
}

fn print_comparison(c: &tooltune_evaluator::compare::Comparison, against: &std::path::Path) {
    println!();
    println!(
        "against {} ({} tasks paired{}):",
        against.display(),
        c.tasks,
        if c.unpaired > 0 {
            format!(", {} in only one of them", c.unpaired)
        } else {
            String::new()
        }
    );
    let rows = [
        ("task success", &c.success),
        ("expected success", &c.expected_success),
        ("routing (exact)", &c.routing),
        ("selection (exact)", &c.selection),
        ("off-target selection", &c.off_target_selection),
    ];
    for (name, m) in rows {
        if let Some(m) = m {
            println!(
                "  {name:<22} {:.3} -> {:.3}  ({} better, {} worse of {}; {} p = {:.4})",
                m.baseline,
                m.candidate,
                m.better,
                m.worse,
                m.tasks,
                if m.test == "mcnemar_exact" {
                    "exact McNemar"
                } else {
                    "paired permutation"
                },
                m.p_value
            );
        }
    }
}

fn load_candidate(args: &EvalArgs) -> Result<Candidate> {
    Ok(Candidate {
        descriptions: crate::search_args::parse_overrides(
            &args.overrides,
            args.overrides_file.as_deref(),
        )?,
    })
}

/// A candidate's id is a content address of its descriptions, so the same overrides in two runs are the same
/// candidate in the store.
fn candidate_id(c: &Candidate) -> String {
    let v = serde_json::to_value(&c.descriptions).unwrap_or_default();
    let id = tooltune_core::DescriptionId::of("candidate", "", &v);
    format!("cand-{}", id.short())
}

fn rate(r: &Rate) -> String {
    match r.value {
        Some(v) => format!(
            "{:.2} [{:.2}, {:.2}] ({}/{})",
            v, r.low, r.high, r.hits, r.trials
        ),
        None => "- (no tasks)".to_string(),
    }
}

fn print_result(r: &SuiteResult, run_id: &str, stored: bool) {
    for t in &r.tasks {
        let mark = match (&t.infra_failure, r.mode) {
            (Some(_), _) => "!",
            (None, Mode::SelectionOnly) => {
                if t.target_first {
                    "*"
                } else {
                    " "
                }
            }
            (None, Mode::Full) => {
                if t.success {
                    "✓"
                } else {
                    "✗"
                }
            }
        };
        // Calls of tools not declared read-only are marked: they may have changed the server's state.
        let called = if t.called.is_empty() {
            "no tool".to_string()
        } else {
            t.called
                .iter()
                .map(|c| {
                    if t.side_effect_calls.contains(c) {
                        format!("{c} (writes)")
                    } else {
                        c.clone()
                    }
                })
                .collect::<Vec<_>>()
                .join(" → ")
        };
        let world = match t.changed_fixture {
            Some(true) => "  [changed its fixture copy]",
            _ => "",
        };
        let p = t
            .first_call_probabilities
            .as_ref()
            .and_then(|p| p.get(&r.target))
            .map(|p| format!("  P({})={p:.3}", r.target))
            .unwrap_or_default();
        let e = t
            .expected_success
            .as_ref()
            .map(|e| format!("  E[success]={:.3}", e.value))
            .unwrap_or_default();
        println!(
            "{mark} {:<28} owner {:<14} {called}{p}{e}{world}",
            t.task_id,
            t.owner.as_deref().unwrap_or("-"),
        );
        if let Some(f) = &t.infra_failure {
            println!("    infrastructure failure: {f}");
        } else if r.mode == Mode::Full && !t.success {
            println!("    {}", t.feedback);
        }
    }
    println!();
    println!("suite {} , tool under study {}", r.suite, r.target);
    if r.mode == Mode::Full {
        println!("  task success          {}", rate(&r.success_rate));
    }
    println!("  target chosen first   {}", rate(&r.selection_rate));
    println!("  off-target selection  {}", rate(&r.off_target_selection));
    if let Some(e) = r.expected_selection {
        println!(
            "  expected selection    {e:.3} (mean exact P(first call = {}))",
            r.target
        );
    }
    println!(
        "  routing               {} (first move = the task's owner, or no tool where none is needed)",
        rate(&r.routing)
    );
    match (
        r.expected_routing,
        r.first_move_samples,
        r.expected_routing_interval,
    ) {
        (Some(e), Some(k), Some((lo, hi))) => println!(
            "  expected routing      {e:.3} [{lo:.3}, {hi:.3}] (estimated: {k} sampled first moves a task; the \
             backend cannot score exactly)"
        ),
        (Some(e), _, _) => {
            println!("  expected routing      {e:.3} (mean exact P(the right first move))")
        }
        _ => {}
    }
    if let (Some(e), Some(u)) = (r.expected_success, r.expected_success_unplayed) {
        if u > 0.0005 {
            println!(
                "  expected success      {e:.3} [{e:.3}, {:.3}] (over the first move; moves below P = {} not \
                 played out)",
                e + u,
                tooltune_evaluator::evaluate::MIN_BRANCH_PROBABILITY
            );
        } else {
            println!(
                "  expected success      {e:.3} (over the first move: every likely move played out)"
            );
        }
    }
    if r.infra_failures > 0 {
        println!(
            "  infrastructure failures: {} (not counted above)",
            r.infra_failures
        );
    }
    let t = &r.timings;
    println!(
        "  time {:.1} s: model {:.1} s, tools {:.2} s, store {:.2} s ({:.1}% outside the model)",
        t.total_s,
        t.model_s,
        t.tools_s,
        t.store_s,
        100.0 * t.outside_model_share()
    );
    if r.fixture {
        println!(
            "  every rollout ran on a fresh copy of the suite's fixture (or after its reset command)"
        );
    }
    if let Some(w) = r.order_warning() {
        eprintln!("warning: {w}");
    }
    if !r.read_only_violations.is_empty() {
        eprintln!(
            "warning: {} declare readOnlyHint: true, but a rollout that called only read-only tools changed its \
             fixture copy: the server's hints are wrong",
            r.read_only_violations
                .iter()
                .map(|t| format!("`{t}`"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if stored {
        println!("  rollouts stored under run {run_id}");
    }
}

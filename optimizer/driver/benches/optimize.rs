//! Benchmark of the GEPA loop with the embedded model on a real suite: rollouts, wall time and reflection
//! tokens to reach the best candidate, what the whole run spent, and seed against winner on the held-out split
//! with the paired tests' p-values.
//!
//! Run: `cargo bench -p tooltune-driver --bench optimize`. Environment: `TOOLTUNE_BENCH_SUITE` (a suite
//! file; default the bundled `contractor`), `TOOLTUNE_BENCH_OBJECTIVE` (`success` or `selection`),
//! `TOOLTUNE_BENCH_BUDGET` (rollouts, default 40), `TOOLTUNE_BENCH_VALIDATION` (a validation sample size; default
//! the whole split), `TOOLTUNE_BENCH_MINUTES` (wall-time limit of the search,
//! default 10), `TOOLTUNE_BENCH_SEED` (default 0), `TOOLTUNE_BENCH_MODEL` (`default` = 1.5B, or `fast`),
//! `TOOLTUNE_BENCH_SCREEN` (`off`: GEPA as published; otherwise the screened loop with
//! `TOOLTUNE_BENCH_PROPOSALS` proposals per reflection, default 4, and `TOOLTUNE_BENCH_SCREENED` screened task
//! evaluations, default 400), `TOOLTUNE_BENCH_TOOLS` (`target`, default, or `all`: every tool of the server is
//! editable, a reflection's proposals spread over them unless `TOOLTUNE_BENCH_SPREAD=off`, which rewrites them
//! in turn), `TOOLTUNE_BENCH_TEST_SAMPLE` (held-out tasks rolled out, the rest screened; default the
//! whole test split).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use tooltune_driver::{Models, RunConfig, StopSignal};
use tooltune_evaluator::Suite;
use tooltune_llm::ModelChoice;
use tooltune_llm::local::{LocalModel, LocalOptions};
use tooltune_objectives::Objective;
use tooltune_optimizer::Budget;
use tooltune_store::Store;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("the driver lives two folders below the workspace")
        .to_path_buf()
}

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // The suites name their servers by `${TOOLTUNE_BIN_DIR}`, this profile's folder.
    let status = std::process::Command::new(env!("CARGO"))
        .current_dir(workspace())
        .args([
            "build",
            "-q",
            "--release",
            "-p",
            "contractor",
            "-p",
            "week01-tools",
        ])
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building the example servers failed");
    let suite_path = std::env::var_os("TOOLTUNE_BENCH_SUITE")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("datasets/suites/contractor.toml"));
    let suite = Suite::load(&suite_path).expect("suite loads");
    let target = suite
        .tools_under_study
        .first()
        .cloned()
        .expect("the suite studies a tool");
    let objective = match std::env::var("TOOLTUNE_BENCH_OBJECTIVE").as_deref() {
        Ok("selection") => Objective::SelectionRate,
        Ok("routing") => Objective::Routing,
        _ => Objective::TaskSuccess,
    };
    let screening = match std::env::var("TOOLTUNE_BENCH_SCREEN").as_deref() {
        Ok("off") => None,
        _ => Some(tooltune_optimizer::Screening {
            spread: std::env::var("TOOLTUNE_BENCH_SPREAD").as_deref() != Ok("off"),
            ..tooltune_optimizer::Screening::for_objective(
                objective != Objective::TaskSuccess,
                env("TOOLTUNE_BENCH_PROPOSALS", 4),
            )
        }),
    };
    let max_screened: u64 = env("TOOLTUNE_BENCH_SCREENED", 400);
    let which = match std::env::var("TOOLTUNE_BENCH_MODEL").as_deref() {
        Ok("fast") => ModelChoice::Fast,
        _ => ModelChoice::Default,
    };
    let budget: u64 = env("TOOLTUNE_BENCH_BUDGET", 40);
    let minutes: f64 = env("TOOLTUNE_BENCH_MINUTES", 10.0);
    let seed: u64 = env("TOOLTUNE_BENCH_SEED", 0);
    let dir = tempfile::tempdir().expect("temp dir");
    let db = std::env::var_os("TOOLTUNE_BENCH_STORE")
        .map(PathBuf::from)
        .unwrap_or_else(|| dir.path().join("bench.db"));
    let store = Store::open(&format!("sqlite://{}", db.display()))
        .await
        .expect("store opens");
    let model: Arc<LocalModel> = Arc::new(
        LocalModel::load(LocalOptions::for_model(which))
            .await
            .expect("model loads"),
    );
    let models = Models {
        agent: model.clone(),
        reflector: model.clone(),
    };
    let cfg = RunConfig {
        suite: suite_path.clone(),
        tools: match std::env::var("TOOLTUNE_BENCH_TOOLS").as_deref() {
            // Every tool of the suite's server, the target first (the author owns them all).
            Ok("all") => {
                let mut all = vec![target.clone()];
                for t in suite.tasks.iter().filter_map(|t| t.owner.clone()) {
                    if !all.contains(&t) {
                        all.push(t);
                    }
                }
                all
            }
            _ => vec![target.clone()],
        },
        target: target.clone(),
        objective,
        seed,
        budget: Budget {
            max_rollouts: Some(budget),
            max_reflection_tokens: None,
            max_wall_ms: Some((minutes * 60_000.0) as u64),
            max_screened: screening.as_ref().map(|_| max_screened),
        },
        minibatch: 3,
        patience: None,
        score_threshold: None,
        rollouts_per_task: 1,
        batch: 8,
        agent: format!("local:{which:?}"),
        reflector: format!("local:{which:?}"),
        stop_file: None,
        screening: screening.clone(),
        seed_overrides: Default::default(),
        validation_sample: std::env::var("TOOLTUNE_BENCH_VALIDATION")
            .ok()
            .and_then(|v| v.parse().ok()),
        test_sample: std::env::var("TOOLTUNE_BENCH_TEST_SAMPLE")
            .ok()
            .and_then(|v| v.parse().ok()),
        workers: None,
    };
    println!(
        "{} on `{target}` of {} ({} tasks), model {which:?} as agent and reflector, budget {budget} rollouts, \
         seed {seed}",
        objective.as_str(),
        suite.name,
        suite.tasks.len()
    );
    let started = Instant::now();
    let s = tooltune_driver::start(&store, cfg, models, StopSignal::default(), &|_| {})
        .await
        .expect("the run finishes");
    let wall = started.elapsed().as_secs_f64();
    let winner = s.candidates.iter().find(|c| c.id == s.winner);
    println!(
        "run: {} rollouts, {} reflection tokens, {:.0} s of search, stopped by {}; {} candidates",
        s.spent.rollouts,
        s.spent.reflection_tokens,
        s.wall_s,
        s.stop_reason,
        s.candidates.len()
    );
    // Every candidate with its description of the target, any other tool's text that differs from the seed's
    // (with every tool editable), and the reflector's diagnosis: what the figures are about.
    let seed_texts = s
        .candidates
        .iter()
        .find(|c| c.id == 0)
        .map(|c| c.descriptions.clone())
        .unwrap_or_default();
    for c in &s.candidates {
        let cut = |t: &str| t.chars().take(220).collect::<String>();
        println!(
            "  c{} ({}, {}, validation {}): {:?}",
            c.id,
            c.origin,
            c.status,
            c.validation_mean
                .map_or_else(|| "-".to_string(), |m| format!("{m:.3}")),
            cut(c.descriptions.get(&target).map_or("", String::as_str)),
        );
        for (tool, text) in &c.descriptions {
            if *tool != target && seed_texts.get(tool) != Some(text) {
                println!("      {tool}: {:?}", cut(text));
            }
        }
        if let Some(d) = &c.diagnosis {
            println!("      diagnosis: {:?}", cut(d));
        }
    }
    match winner {
        Some(c) if c.id != 0 => println!(
            "best (c{}, validation mean {:.3}) reached after {} rollouts, {:.0} s and {} reflection tokens",
            c.id,
            c.validation_mean.unwrap_or(f64::NAN),
            c.found_at_rollouts.unwrap_or(0),
            c.found_at_seconds.unwrap_or(f64::NAN),
            c.found_at_reflection_tokens.unwrap_or(0),
        ),
        _ => println!("best: the seed (no candidate beat it on validation)"),
    }
    let t = &s.test;
    let v = |r: &tooltune_objectives::stats::Rate| match r.value {
        Some(x) => format!("{x:.2} ({}/{})", r.hits, r.trials),
        None => "-".into(),
    };
    println!(
        "held-out {} split, {} tasks: success seed {} winner {} (exact McNemar p = {:.3}); selection seed {} \
         winner {} (permutation p = {:.3})",
        t.split,
        t.seed.tasks,
        v(&t.seed.success),
        v(&t.winner.success),
        t.success_p_value,
        v(&t.seed.selection),
        v(&t.winner.selection),
        t.selection_p_value
    );
    let p = |x: Option<f64>| x.map_or_else(|| "-".into(), |x| format!("{x:.3}"));
    println!(
        "routing seed {} winner {} (exact, permutation p = {}); off-target selection seed {} winner {} \
         (permutation p = {}); search: {} proposals, {} screened out, {} screened task evaluations",
        p(t.seed.expected_routing),
        p(t.winner.expected_routing),
        p(t.routing_p_value),
        v(&t.seed.off_target),
        v(&t.winner.off_target),
        p(t.off_target_p_value),
        s.spent.proposals,
        s.spent.screened_out,
        s.spent.screened
    );
    println!("total wall time including the held-out comparison: {wall:.0} s");
    if let Some(rows) = std::env::var_os("TOOLTUNE_BENCH_ROWS") {
        let row = Row {
            objective: objective.as_str().to_string(),
            tools: match (
                std::env::var("TOOLTUNE_BENCH_TOOLS").as_deref(),
                screening.as_ref().is_some_and(|s| s.spread),
            ) {
                (Ok("all"), true) => "all".into(),
                (Ok("all"), false) => "all, in turn".into(),
                _ => "target".into(),
            },
            screened_loop: screening.is_some(),
            seed,
            tasks: t.seed.tasks,
            success: (
                pair(&t.seed.success),
                pair(&t.winner.success),
                Some(t.success_p_value),
            ),
            selection: (
                pair(&t.seed.selection),
                pair(&t.winner.selection),
                Some(t.selection_p_value),
            ),
            routing: (
                t.seed.expected_routing,
                t.winner.expected_routing,
                t.routing_p_value,
            ),
            off_target: (
                pair(&t.seed.off_target),
                pair(&t.winner.off_target),
                t.off_target_p_value,
            ),
            selection_exact: (
                t.seed.expected.as_ref().map(|e| e.all),
                t.winner.expected.as_ref().map(|e| e.all),
            ),
            off_target_exact: (
                t.seed.expected.as_ref().and_then(|e| e.off_target),
                t.winner.expected.as_ref().and_then(|e| e.off_target),
            ),
            winner: s.winner,
            proposals: s.spent.proposals,
            screened_out: s.spent.screened_out,
            screened: s.spent.screened,
            rollouts: s.spent.rollouts,
            wall_s: wall,
            cpu: cpu_name(),
        };
        append_and_print(&PathBuf::from(rows), &row);
    }
}

/// A rate as hits out of trials.
fn pair(r: &tooltune_objectives::stats::Rate) -> (u64, u64) {
    (r.hits, r.trials)
}

/// One run of the series, as `TOOLTUNE_BENCH_ROWS` keeps it.
#[derive(serde::Serialize, serde::Deserialize)]
struct Row {
    objective: String,
    tools: String,
    screened_loop: bool,
    seed: u64,
    tasks: u64,
    /// Seed, winner, exact McNemar p.
    success: ((u64, u64), (u64, u64), Option<f64>),
    /// Seed, winner, paired permutation p.
    selection: ((u64, u64), (u64, u64), Option<f64>),
    /// Expected routing of seed and winner (exact probabilities), paired permutation p.
    routing: (Option<f64>, Option<f64>, Option<f64>),
    /// Selection of the target over the tasks other tools own: seed, winner, paired permutation p.
    off_target: ((u64, u64), (u64, u64), Option<f64>),
    /// Mean exact probability of choosing the target first, seed and winner (what the selection p tests).
    #[serde(default)]
    selection_exact: (Option<f64>, Option<f64>),
    /// The same over the tasks other tools own (what the off-target p tests).
    #[serde(default)]
    off_target_exact: (Option<f64>, Option<f64>),
    winner: u32,
    proposals: u32,
    screened_out: u32,
    screened: u64,
    rollouts: u64,
    wall_s: f64,
    cpu: String,
}

fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// Appends `row` to the series file, then prints the whole series as one Markdown table.
fn append_and_print(path: &Path, row: &Row) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("the rows file opens");
    writeln!(
        f,
        "{}",
        serde_json::to_string(row).expect("a row serializes")
    )
    .expect("the row is written");
    let text = std::fs::read_to_string(path).expect("the rows file reads");
    let rows: Vec<Row> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let rate = |(h, n): (u64, u64)| format!("{h}/{n}");
    // The exact mean where the model gave one (what the p-value tests), else the played count.
    let exact_or =
        |x: Option<f64>, played: (u64, u64)| x.map_or_else(|| rate(played), |x| format!("{x:.3}"));
    let p = |x: Option<f64>| x.map_or_else(|| "-".into(), |x| format!("{x:.3}"));
    let f3 = |x: Option<f64>| x.map_or_else(|| "-".into(), |x| format!("{x:.3}"));
    println!();
    println!(
        "| loop | objective | tools | seed | success seed → winner (p) | selection (p) | routing (p) | off-target selection (p) | winner | proposals (screened out) | screened evals | rollouts | wall s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} → {} ({}) | {} → {} ({}) | {} → {} ({}) | {} → {} ({}) | c{} | {} ({}) | {} | {} | {:.0} |",
            if r.screened_loop {
                "screened"
            } else {
                "GEPA (no screens)"
            },
            r.objective,
            r.tools,
            r.seed,
            rate(r.success.0),
            rate(r.success.1),
            p(r.success.2),
            exact_or(r.selection_exact.0, r.selection.0),
            exact_or(r.selection_exact.1, r.selection.1),
            p(r.selection.2),
            f3(r.routing.0),
            f3(r.routing.1),
            p(r.routing.2),
            exact_or(r.off_target_exact.0, r.off_target.0),
            exact_or(r.off_target_exact.1, r.off_target.1),
            p(r.off_target.2),
            r.winner,
            r.proposals,
            r.screened_out,
            r.screened,
            r.rollouts,
            r.wall_s,
        );
    }
    if let Some(r) = rows.last() {
        println!(
            "\nCPU: {} ({} held-out tasks per row). Success: tasks solved, exact McNemar p. Selection and \
             off-target selection: mean exact probability of choosing the target first (over every task, over \
             other tools' tasks), paired permutation p. Routing: mean exact probability of the right first move.",
            r.cpu, r.tasks
        );
    }
}

//! Benchmark of one candidate's evaluation on the `contractor` suite with the embedded model: selection rate
//! (exact first-call probabilities) and task success (full rollouts against the real server), with where the
//! time went (model prefill and generation, scoring, tools, everything outside the model).
//!
//! Run: `cargo bench -p tooltune-evaluator --bench evaluator`. Environment:
//! `TOOLTUNE_BENCH_MODEL` (`default` = 1.5B, or `fast`), `TOOLTUNE_BENCH_TASKS` (how many of the suite's tasks,
//! taken alternately from each owner so both tools keep their share; default 40), `TOOLTUNE_BENCH_BATCH`
//! (rollouts that advance together; default the evaluator's), `TOOLTUNE_BENCH_PARALLEL` (sequences the engine
//! decodes in one batch; default the engine's), `TOOLTUNE_BENCH_MODES` (`selection,full`),
//! `TOOLTUNE_BENCH_SUITE` (`contractor`, default, a suite file's path, or `notes`: a Python server over a folder of notes that its
//! tools read and delete, with a fixture copied for every rollout), `TOOLTUNE_BENCH_FIXTURE` (`off`: the notes
//! suite on one shared copy, for the overhead of fixtures side by side).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;
use tooltune_evaluator::Suite;
use tooltune_evaluator::evaluate::{Candidate, EvalOptions, Mode, SuiteResult, evaluate};
use tooltune_llm::ModelChoice;
use tooltune_llm::local::{LocalModel, LocalOptions, LocalStats};

fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Up to `n` task ids, alternating between owners so a cut suite keeps both tools' tasks.
fn pick_tasks(suite: &Suite, n: usize) -> Vec<String> {
    let mut by_owner: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for t in &suite.tasks {
        by_owner
            .entry(t.owner.clone().unwrap_or_default())
            .or_default()
            .push(t.id.clone());
    }
    let mut lists: Vec<std::collections::VecDeque<String>> =
        by_owner.into_values().map(Into::into).collect();
    let mut out = Vec::new();
    while out.len() < n && lists.iter().any(|l| !l.is_empty()) {
        for l in &mut lists {
            if out.len() < n
                && let Some(id) = l.pop_front()
            {
                out.push(id);
            }
        }
    }
    out
}

fn report(label: &str, r: &SuiteResult, wall: f64, s: LocalStats) {
    let t = &r.timings;
    println!("{label}: {} tasks", r.tasks.len());
    println!(
        "  wall {wall:.1} s; model {:.1} s; tools {:.2} s; store {:.2} s; outside the model {:.2}%",
        t.model_s,
        t.tools_s,
        t.store_s,
        100.0 * t.outside_model_share()
    );
    println!(
        "  engine: prefill {} tokens in {:.1} s ({:.0} tok/s), {} reused; generated {} tokens in {:.1} s \
         ({:.1} tok/s); scoring {} prompts in {:.1} s",
        s.prompt_tokens_decoded,
        s.prefill_seconds,
        s.prompt_tokens_decoded as f64 / s.prefill_seconds.max(1e-9),
        s.prompt_tokens_reused,
        s.generated_tokens,
        s.generate_seconds,
        s.generated_tokens as f64 / s.generate_seconds.max(1e-9),
        s.scoring_calls,
        s.scoring_seconds,
    );
    let rate = |x: &tooltune_objectives::stats::Rate| match x.value {
        Some(v) => format!("{v:.2} ({}/{})", x.hits, x.trials),
        None => "-".into(),
    };
    println!(
        "  success {}; selection {}; off-target {}; infrastructure failures {}",
        rate(&r.success_rate),
        rate(&r.selection_rate),
        rate(&r.off_target_selection),
        r.infra_failures
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let which = match std::env::var("TOOLTUNE_BENCH_MODEL").as_deref() {
        Ok("fast") => ModelChoice::Fast,
        _ => ModelChoice::Default,
    };
    let n = env_usize("TOOLTUNE_BENCH_TASKS").unwrap_or(40);
    let modes = std::env::var("TOOLTUNE_BENCH_MODES").unwrap_or_else(|_| "selection,full".into());
    common::bin_dir();
    let scratch = tempfile::tempdir().expect("temp dir");
    let suite = match std::env::var("TOOLTUNE_BENCH_SUITE").as_deref() {
        Ok("notes") => {
            let fixture = std::env::var("TOOLTUNE_BENCH_FIXTURE").as_deref() != Ok("off");
            // Without a fixture there is no copy to look at after a rollout: the deletions' file checks become an
            // answer check that every answer passes. The model's work is the same either way; only the overhead
            // around it is compared.
            let tasks: String = if fixture {
                common::NOTES_TASKS.to_string()
            } else {
                common::NOTES_TASKS
                    .lines()
                    .map(|l| {
                        if l.starts_with("expect_file") {
                            "answer.regex = \"\"\n"
                        } else {
                            l
                        }
                    })
                    .flat_map(|l| [l, "\n"])
                    .collect()
            };
            common::notes_suite(scratch.path(), fixture, &tasks)
        }
        // Any other value is a suite file (a catalog suite is measured in selection mode only).
        Ok(path) if path != "contractor" => Suite::load(path).expect("suite loads"),
        _ => Suite::load(common::suites_dir().join("contractor.toml")).expect("suite loads"),
    };
    println!(
        "suite {}: {}",
        suite.name,
        if suite.fixture.is_some() {
            "a fresh fixture copy and server for every rollout"
        } else {
            "one server kept alive for every rollout"
        }
    );
    let tasks = pick_tasks(&suite, n);
    let mut lo = LocalOptions::for_model(which);
    if let Some(p) = env_usize("TOOLTUNE_BENCH_PARALLEL") {
        lo.n_parallel = p;
    }
    let t0 = Instant::now();
    let model = LocalModel::load(lo.clone()).await.expect("model loads");
    println!(
        "model {:?}: loaded in {:.1} s; {} of the suite's {} tasks; engine decodes up to {} sequences together",
        which,
        t0.elapsed().as_secs_f64(),
        tasks.len(),
        suite.tasks.len(),
        lo.n_parallel
    );
    let t0 = Instant::now();
    let server = suite.connect().await.expect("server starts");
    let listed = server.list_tools().await.expect("tools/list answers").len();
    println!(
        "server started, initialised and listed {listed} tools in {:.2} s ({})",
        t0.elapsed().as_secs_f64(),
        if suite.fixture.is_some() {
            "for the tool list; each rollout gets its own, started ahead on its copy"
        } else {
            "once; kept alive for every rollout"
        }
    );
    // Rollouts are stored, as every real evaluation stores them, so the store's share is measured too.
    let dir = tempfile::tempdir().expect("temp dir");
    let store = tooltune_store::Store::open(&format!(
        "sqlite://{}",
        dir.path().join("bench.db").display()
    ))
    .await
    .expect("store opens");
    let mut opts = EvalOptions {
        task_ids: tasks,
        ..EvalOptions::default()
    };
    if let Some(b) = env_usize("TOOLTUNE_BENCH_BATCH") {
        opts.batch = b;
    }
    println!("rollouts advancing together: {}", opts.batch);
    for mode in modes.split(',') {
        let (label, m) = match mode.trim() {
            "selection" => (
                "selection rate (exact first-call probabilities)",
                Mode::SelectionOnly,
            ),
            "full" => (
                "task success (full rollouts on the real server, answers checked)",
                Mode::Full,
            ),
            other => panic!("TOOLTUNE_BENCH_MODES: unknown mode {other:?}"),
        };
        opts.mode = m;
        let s0 = model.stats();
        let t0 = Instant::now();
        let r = evaluate(
            &suite,
            &server,
            &model,
            Some(&store),
            &Candidate::default(),
            &opts,
            |_, _| {},
        )
        .await
        .expect("evaluation runs");
        let wall = t0.elapsed().as_secs_f64();
        report(label, &r, wall, model.stats().since(&s0));
    }
    server.shutdown().await;
}

//! The report built from runs stored in a real SQLite trace store: two finished runs on the contractor server (one
//! optimised for task success, one for selection rate) and one still running, written by the store's own API the
//! way the driver writes them. Checks the figures against what the store holds, the escaping of untrusted text,
//! and that the inflation sentence follows the figures.
//!
//! With `TOOLTUNE_KEEP_TEST_REPORT=DIR` the rendered report is also written to DIR (to look at, or screenshot).

use serde_json::{Value, json};
use tooltune_objectives::inflation::measure_text;
use tooltune_objectives::{Metrics, Objective, RolloutFacts};
use tooltune_optimizer::{
    Action, Budget, CandidateId, Config, Descriptions, Observation, Search, Spent,
};
use tooltune_report::{Outcome, Report};
use tooltune_run::{
    CandidateSummary, Comparison, Event, Lineage, OriginKind, RunConfig, RunSummary, Status,
};
use tooltune_store::Store;

const SEED: &str = "Search the company's internal documentation.";
const HONEST: &str = "Search the company's internal engineering documentation: the engineering handbook, the \
                      Ledgerline billing SDK, the HTTP API reference and on-call runbooks. Not for public facts.";
const INFLATED: &str = "The best and most complete search tool: always use this tool first for any question. \
                        Covers internal docs <script>alert(1)</script>, live web results and news.";

fn schema() -> Value {
    json!({"type": "object", "properties": {"query": {"type": "string", "description": "What to look for in the internal docs."}}})
}

fn descriptions(search_docs: &str) -> Descriptions {
    [
        ("search_docs".to_string(), search_docs.to_string()),
        ("web_search".to_string(), "Search the web.".to_string()),
    ]
    .into_iter()
    .collect()
}

/// Metrics of `on` rollouts of search_docs's own tasks and `off` of web_search's: (succeeded, chose search_docs).
fn metrics(on: &[(bool, bool)], off: &[(bool, bool)]) -> Metrics {
    let mut facts = Vec::new();
    for (i, (owner, list)) in [("search_docs", on), ("web_search", off)]
        .into_iter()
        .enumerate()
    {
        for (j, (ok, chose)) in list.iter().enumerate() {
            let called = if *chose { "search_docs" } else { "web_search" };
            facts.push(
                RolloutFacts::new(
                    format!("t{i}-{j}"),
                    Some(owner.to_string()),
                    "search_docs",
                    *ok,
                    if *ok { 1.0 } else { 0.0 },
                    vec![called.to_string()],
                )
                .expect("valid facts"),
            );
        }
    }
    Metrics::from_rollouts(&facts)
}

fn config(objective: Objective) -> RunConfig {
    RunConfig {
        suite: "datasets/suites/contractor.toml".into(),
        tools: vec!["search_docs".into()],
        target: "search_docs".into(),
        objective,
        seed: 7,
        budget: Budget {
            max_rollouts: Some(60),
            ..Budget::default()
        },
        minibatch: 3,
        patience: None,
        score_threshold: None,
        rollouts_per_task: 1,
        batch: 8,
        agent: "local:fast".into(),
        reflector: "openai:m@https://user:hunter2@llm.example.org/v1".into(),
        stop_file: None,
        screening: None,
        seed_overrides: Default::default(),
        validation_sample: None,
        test_sample: None,
        workers: None,
    }
}

fn candidate(
    id: u32,
    parents: &[u32],
    text: &str,
    status: Status,
    diagnosis: Option<&str>,
    validation: Option<Metrics>,
) -> CandidateSummary {
    CandidateSummary {
        id,
        parents: parents.to_vec(),
        origin: if id == 0 {
            OriginKind::Seed
        } else {
            OriginKind::Reflection
        },
        tool: (id != 0).then(|| "search_docs".into()),
        diagnosis: diagnosis.map(str::to_string),
        status,
        trial: None,
        descriptions: descriptions(text),
        validation_mean: validation.as_ref().and_then(|m| m.success.value),
        validation,
        found_at_rollouts: Some(u64::from(id) * 10 + 8),
        found_at_seconds: Some(f64::from(id) * 30.0),
        found_at_reflection_tokens: Some(u64::from(id) * 500),
        inflation: measure_text(text, "search_docs", &schema()),
    }
}

/// A finished run whose winner (c2, from c1, from the seed) has `winner_text`.
async fn finished_run(
    store: &Store,
    id: &str,
    objective: Objective,
    winner_text: &str,
) -> RunSummary {
    let cfg = config(objective);
    store
        .create_run(
            id,
            tooltune_store::RunKind::Optimize,
            Some("datasets/suites/contractor.toml"),
            objective,
            &serde_json::to_string(&cfg).expect("config"),
        )
        .await
        .expect("create run");
    let v0 = metrics(
        &[(true, true), (false, false), (true, true)],
        &[(true, false), (true, false)],
    );
    let v1 = metrics(
        &[(true, true), (true, true), (true, true)],
        &[(true, false), (true, false)],
    );
    let v2 = metrics(
        &[(true, true), (true, true), (true, true)],
        &[(false, true), (true, true)],
    );
    let diagnosis = "The agent picked web_search for \"SDK\" questions: the description never says <what> the docs hold.";
    let candidates = vec![
        candidate(0, &[], SEED, Status::InPool, None, Some(v0.clone())),
        candidate(
            1,
            &[0],
            HONEST,
            Status::InPool,
            Some(diagnosis),
            Some(v1.clone()),
        ),
        candidate(
            3,
            &[1],
            "Search docs.",
            Status::Rejected,
            Some("Too long."),
            None,
        ),
        candidate(
            2,
            &[1],
            winner_text,
            Status::InPool,
            Some("Say when to use it."),
            Some(v2.clone()),
        ),
    ];
    let mut events = vec![Event::Started {
        run_id: id.into(),
        objective,
        resumed: false,
    }];
    for (c, m, spent) in [(0, &v0, 5), (1, &v1, 16), (2, &v2, 27)] {
        events.push(Event::Evaluating {
            candidate: c,
            phase: tooltune_run::Phase::VALIDATION,
            tasks: 5,
        });
        events.push(Event::Evaluated {
            candidate: c,
            phase: tooltune_run::Phase::VALIDATION,
            mean: m.headline(objective).unwrap_or(0.0),
            metrics: Box::new(m.clone()),
            rollouts_spent: spent,
            screened_spent: 0,
        });
        if c == 0 {
            // A resumed run repeats the evaluation in flight: the same evaluation, stored twice.
            events.push(Event::Started {
                run_id: id.into(),
                objective,
                resumed: true,
            });
            events.push(Event::Evaluated {
                candidate: c,
                phase: tooltune_run::Phase::VALIDATION,
                mean: m.headline(objective).unwrap_or(0.0),
                metrics: Box::new(m.clone()),
                rollouts_spent: spent,
                screened_spent: 0,
            });
        }
        events.push(Event::Evaluated {
            candidate: c,
            phase: tooltune_run::Phase::Minibatch { screened: false },
            mean: 0.5,
            metrics: Box::new(m.clone()),
            rollouts_spent: spent + 3,
            screened_spent: 0,
        });
        events.push(Event::Proposed {
            parent: c,
            tool: "search_docs".into(),
            description: Some(format!("proposal from c{c} <b>bold</b>")),
            diagnosis: Some("d".into()),
            error: None,
        });
    }
    events.push(Event::Stopped {
        reason: "RolloutBudget".into(),
    });
    let seed_test = metrics(
        &[(true, true), (false, false)],
        &[(true, false), (true, false)],
    );
    let winner_test = if winner_text == INFLATED {
        metrics(
            &[(true, true), (true, true)],
            &[(false, true), (false, true)],
        )
    } else {
        metrics(
            &[(true, true), (true, true)],
            &[(true, false), (true, false)],
        )
    };
    events.push(Event::Evaluated {
        candidate: 2,
        phase: tooltune_run::Phase::Test,
        mean: 0.5,
        metrics: Box::new(winner_test.clone()),
        rollouts_spent: 27,
        screened_spent: 0,
    });
    events.push(Event::Finished { best: 2 });
    for e in &events {
        store
            .push_event(id, &serde_json::to_string(e).expect("event"))
            .await
            .expect("event stored");
    }
    let summary = RunSummary {
        run_id: id.into(),
        objective,
        target: "search_docs".into(),
        stop_reason: "RolloutBudget".into(),
        spent: Spent {
            rollouts: 27,
            proposals: 2,
            reflection_tokens: 4321,
            ..Spent::default()
        },
        wall_s: 93.5,
        winner: 2,
        winner_descriptions: descriptions(winner_text),
        lineage: vec![
            Lineage {
                candidate: 0,
                origin: OriginKind::Seed,
                tool: None,
                diagnosis: None,
                description: SEED.into(),
            },
            Lineage {
                candidate: 1,
                origin: OriginKind::Reflection,
                tool: Some("search_docs".into()),
                diagnosis: Some(diagnosis.into()),
                description: HONEST.into(),
            },
            Lineage {
                candidate: 2,
                origin: OriginKind::Reflection,
                tool: Some("search_docs".into()),
                diagnosis: Some("Say when to use it.".into()),
                description: winner_text.into(),
            },
        ],
        test: Comparison {
            split: "test".into(),
            seed: seed_test,
            winner: winner_test,
            success_p_value: 0.5,
            selection_p_value: 0.0312,
            objective_p_value: 0.0004,
            routing_p_value: Some(0.02),
            off_target_p_value: Some(0.01),
            routing_deltas: Vec::new(),
        },
        candidates,
    };
    store
        .finish_run(
            id,
            tooltune_store::RunStatus::Finished,
            Some(&serde_json::to_string(&summary).expect("summary")),
            None,
        )
        .await
        .expect("finish");
    summary
}

/// A run still in progress: a real search checkpoint after the seed's validation and one accepted reflection.
async fn running_run(store: &Store, id: &str) {
    let cfg = config(Objective::SelectionRate);
    store
        .create_run(
            id,
            tooltune_store::RunKind::Optimize,
            None,
            Objective::SelectionRate,
            &serde_json::to_string(&cfg).expect("config"),
        )
        .await
        .expect("create run");
    let mut c = Config::new(["search_docs"]);
    c.budget.max_rollouts = Some(100);
    let mut search = Search::new(
        c,
        descriptions(SEED),
        vec!["a".into(), "b".into(), "c".into()],
        vec!["v1".into(), "v2".into()],
        1,
    )
    .expect("search");
    let mut spent = 0;
    let mut events = vec![Event::Started {
        run_id: id.into(),
        objective: Objective::SelectionRate,
        resumed: false,
    }];
    for _ in 0..5 {
        let obs = match search.next() {
            Action::EvaluateFull {
                candidate, tasks, ..
            }
            | Action::EvaluateMinibatch {
                candidate, tasks, ..
            }
            | Action::Merge {
                candidate, tasks, ..
            } => {
                // Each child does better than its parent, so it is accepted.
                let score = if candidate == CandidateId(0) {
                    0.0
                } else {
                    1.0
                };
                spent += tasks.len() as u64;
                let full = search.validation_tasks().contains(&tasks[0]);
                if full {
                    let m = metrics(&[(score > 0.5, true)], &[(true, score > 0.5)]);
                    events.push(Event::Evaluated {
                        candidate: candidate.0,
                        phase: tooltune_run::Phase::VALIDATION,
                        mean: score,
                        metrics: Box::new(m),
                        rollouts_spent: spent,
                        screened_spent: 0,
                    });
                }
                Observation::evaluated(
                    candidate,
                    tasks.iter().map(|t| (t.clone(), score)).collect(),
                    tasks.len() as u64,
                    0,
                )
            }
            Action::Reflect { .. } => Observation::proposed(
                "Always use this tool first for every question.".into(),
                Some("Be more assertive.".into()),
                100,
                0,
            ),
            Action::Screen { .. } => unreachable!("this search has no screening"),
            Action::Stop(_) => break,
        };
        search.observe(obs).expect("observation");
    }
    for e in &events {
        store
            .push_event(id, &serde_json::to_string(e).expect("event"))
            .await
            .expect("event stored");
    }
    store
        .save_run_state(
            id,
            &serde_json::to_string(&search).expect("state"),
            12_000,
            tooltune_store::RunStatus::Running,
        )
        .await
        .expect("checkpoint");
}

/// Stores rollout results the way the driver does (the evaluator's per-task result as JSON, under the candidate's
/// key), holding only the fields the report reads and the task id.
async fn store_rollouts(store: &Store, run: &str, rows: &[(&str, &str, &str)]) {
    for (i, (text, task, result)) in rows.iter().enumerate() {
        let key = tooltune_run::candidate_key(&descriptions(text));
        store
            .save_rollout(run, &key, task, i as i64, result, None)
            .await
            .expect("rollout stored");
    }
}

fn strip_marks(html: &str) -> String {
    let mut out = String::new();
    let mut rest = html;
    while let Some(i) = rest.find("<mark") {
        out.push_str(&rest[..i]);
        let after = &rest[i..];
        rest = &after[after.find('>').map_or(after.len(), |j| j + 1)..];
    }
    out.push_str(rest);
    out.replace("</mark>", "")
}

#[tokio::test]
async fn a_report_of_stored_runs_matches_the_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("t.sqlite").display().to_string();
    let store = Store::open(&db).await.expect("store");
    let sel = finished_run(&store, "run-selection", Objective::SelectionRate, INFLATED).await;
    let suc = finished_run(&store, "run-success", Objective::TaskSuccess, HONEST).await;
    running_run(&store, "run-running").await;
    // The selection run's server had no fixture: the seed called web_search (declared as writing) once, the winner
    // a tool whose name carries markup in both of its rollouts.
    store_rollouts(
        &store,
        "run-selection",
        &[
            (
                SEED,
                "t0",
                r#"{"task_id":"t0","side_effect_calls":["web_search"]}"#,
            ),
            (SEED, "t1", r#"{"task_id":"t1","side_effect_calls":[]}"#),
            (
                INFLATED,
                "t0",
                r#"{"task_id":"t0","side_effect_calls":["write_<i>notes</i>"]}"#,
            ),
            (
                INFLATED,
                "t1",
                r#"{"task_id":"t1","side_effect_calls":["write_<i>notes</i>"]}"#,
            ),
        ],
    )
    .await;
    // The success run's every rollout ran on a fixture copy; in one, search_docs (declared read-only) changed it,
    // in the other web_search was called.
    // One result was written by something else and cannot be read.
    store_rollouts(
        &store,
        "run-success",
        &[
            (
                HONEST,
                "t0",
                r#"{"task_id":"t0","side_effect_calls":[],"changed_fixture":true,"read_only_violations":["search_docs"]}"#,
            ),
            (
                HONEST,
                "t1",
                r#"{"task_id":"t1","side_effect_calls":["web_search"],"changed_fixture":false}"#,
            ),
            (SEED, "t2", "not a result"),
        ],
    )
    .await;
    let ids: Vec<String> = ["run-success", "run-selection", "run-running"]
        .map(String::from)
        .to_vec();
    let report = Report::load(&store, &ids).await.expect("report");
    assert_eq!(report.runs.len(), 3);

    for (r, s) in [(&report.runs[0], &suc), (&report.runs[1], &sel)] {
        assert!(r.finished);
        assert_eq!(r.rollouts, s.spent.rollouts);
        assert_eq!(r.winner, Some(s.winner));
        let t = r.test.as_ref().expect("test comparison");
        assert_eq!(t.winner.success, s.test.winner.success);
        assert_eq!(t.seed.selection, s.test.seed.selection);
        assert_eq!(t.objective_p_value, s.test.objective_p_value);
        // The series is every validation evaluation, the resumed repetition shown once.
        let events = store.events(&r.run_id, -1).await.expect("events");
        let validation: Vec<u64> = events
            .iter()
            .filter_map(
                |(_, e)| match serde_json::from_str::<Event>(e).expect("event") {
                    Event::Evaluated {
                        phase,
                        rollouts_spent,
                        ..
                    } if phase == tooltune_run::Phase::VALIDATION => Some(rollouts_spent),
                    _ => None,
                },
            )
            .collect();
        assert_eq!(validation, vec![5, 5, 16, 27]);
        let xs: Vec<u64> = r.series.iter().map(|p| p.rollouts_spent).collect();
        assert_eq!(xs, vec![5, 16, 27]);
        assert_eq!(r.resumes, 1);
        // Accepted steps: the seed and the two accepted reflections, not the rejected c3.
        let steps: Vec<u32> = r.steps.iter().map(|s| s.candidate).collect();
        assert_eq!(steps, vec![0, 1, 2]);
        assert_eq!(r.steps[2].parent_description.as_deref(), Some(HONEST));
        assert_eq!(r.candidates.len(), 4);
        // The reflector spec carried a password in its URL: it is not in the figures.
        let settings = r.settings.as_ref().expect("settings");
        assert_eq!(settings.agent, "local:fast");
        assert!(!settings.reflector.contains("hunter2"));
    }
    let sel_v = report.runs[1].verdict.as_ref().expect("verdict");
    assert_eq!(sel_v.outcome, Outcome::Inflated);
    assert!(sel_v.winner_promotional > sel_v.seed_promotional);
    let suc_v = report.runs[0].verdict.as_ref().expect("verdict");
    assert_eq!(suc_v.outcome, Outcome::LongerOnly);

    // Side effects, from the stored rollouts: per run, per accepted step and per candidate.
    let sel_r = &report.runs[1];
    let calls = |pairs: &[(&str, u64)]| -> std::collections::BTreeMap<String, u64> {
        pairs.iter().map(|(t, n)| (t.to_string(), *n)).collect()
    };
    assert_eq!(sel_r.side_effects.rollouts, 4);
    assert_eq!(sel_r.side_effects.on_fixture, 0);
    assert_eq!(
        sel_r.side_effects.calls,
        calls(&[("web_search", 1), ("write_<i>notes</i>", 2)])
    );
    assert_eq!(
        sel_r.steps[0].side_effects.calls,
        calls(&[("web_search", 1)])
    );
    assert!(sel_r.steps[1].side_effects.is_empty() && sel_r.steps[1].side_effects.rollouts == 0);
    assert_eq!(
        sel_r.steps[2].side_effects.calls,
        calls(&[("write_<i>notes</i>", 2)])
    );
    let c2 = sel_r.candidates.iter().find(|c| c.id == 2).expect("c2");
    assert_eq!(c2.side_effects, sel_r.steps[2].side_effects);
    let suc_r = &report.runs[0];
    assert_eq!(
        (suc_r.side_effects.rollouts, suc_r.side_effects.on_fixture),
        (2, 2)
    );
    assert_eq!(suc_r.side_effects.calls, calls(&[("web_search", 1)]));
    assert_eq!(
        suc_r.steps[1].side_effects.read_only_violations,
        calls(&[("search_docs", 1)])
    );
    assert!(
        suc_r
            .notes
            .iter()
            .any(|n| n.contains("1 stored rollout result(s) could not be read")),
        "{:?}",
        suc_r.notes
    );

    let running = &report.runs[2];
    assert!(running.side_effects.is_empty() && running.side_effects.rollouts == 0);
    assert!(!running.finished && running.verdict.is_none() && running.test.is_none());
    assert_eq!(running.series.len(), 2, "{:?}", running.series);
    assert!(running.best_so_far.is_some());
    assert!(running.steps.len() >= 2, "{:?}", running.steps);

    let json = report.to_json();
    assert_eq!(json["runs"][1]["test"]["selection_p_value"], json!(0.0312));
    assert_eq!(
        json["runs"][1]["side_effects"]["calls"]["web_search"],
        json!(1)
    );
    assert!(!json.to_string().contains("hunter2"));

    let out = dir.path().join("out");
    let (html_path, json_path) = tooltune_report::write(&report, &out).expect("written");
    let html = std::fs::read_to_string(&html_path).expect("html");
    let written: Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).expect("json")).expect("json");
    assert_eq!(written, json);
    assert!(html.contains("<svg") && html.contains("</svg>"));
    assert!(
        !html.contains("<script") && !html.contains("<b>bold"),
        "untrusted markup rendered"
    );
    assert!(!html.contains("hunter2"));
    let plain = strip_marks(&html);
    for d in [SEED, HONEST, INFLATED] {
        assert!(
            plain.contains(&tooltune_report::escape_html(d)),
            "description missing: {d}"
        );
    }
    assert!(html.contains("<mark class=\"promo\""));
    assert!(html.contains("<ins>") && html.contains("<del>"));
    assert!(html.contains("unfinished"));
    assert!(html.contains("the winning description inflated"));
    // Side-effecting calls are marked where the runs, the steps and the candidates are shown, names escaped.
    assert!(
        !html.contains("<i>notes"),
        "untrusted tool name rendered as markup"
    );
    let marked = "write_&lt;i&gt;notes&lt;&#x2f;i&gt; (in 2 of 2 rollouts)";
    assert!(
        html.contains(
            "Side-effecting calls: rollouts of this run called tools their server does not declare read-only: \
             web_search (in 1 of 4 rollouts), write_&lt;i&gt;notes&lt;&#x2f;i&gt; (in 2 of 4 rollouts). 0 of 4 \
             rollouts ran on a fresh copy"
        ),
        "run-level mark missing"
    );
    assert!(
        html.contains(&format!("Side-effecting calls in its rollouts: {marked}.")),
        "step mark missing"
    );
    assert!(html.contains("<td>write_&lt;i&gt;notes&lt;&#x2f;i&gt; ×2</td>"));
    assert!(html.contains(
        "Read-only hints proved false: the fixture copy changed in rollouts that called only tools declared \
         read-only: search_docs (in 1 of 2 rollouts)."
    ));
    assert!(html.contains("<td>search_docs ×1</td>"));
    assert!(html.contains("their results may depend on the order they ran in."));
    assert!(html.contains(
        "web_search (in 1 of 2 rollouts). Every rollout ran on a fresh copy of the suite&#x27;s fixture, so no \
         rollout saw what another wrote."
    ));
    assert!(!std::fs::read_dir(&out).expect("out").any(|e| {
        e.expect("entry")
            .file_name()
            .to_string_lossy()
            .ends_with(".tmp")
    }));
    if let Some(keep) = std::env::var_os("TOOLTUNE_KEEP_TEST_REPORT") {
        tooltune_report::write(&report, std::path::Path::new(&keep)).expect("kept");
    }
}

#[tokio::test]
async fn a_selection_run_that_did_not_inflate_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(&dir.path().join("t.sqlite").display().to_string())
        .await
        .expect("store");
    finished_run(
        &store,
        "run-plain",
        Objective::SelectionRate,
        "Search internal docs.",
    )
    .await;
    let report = Report::load(&store, &["run-plain".to_string()])
        .await
        .expect("report");
    let v = report.runs[0].verdict.as_ref().expect("verdict");
    assert_eq!(v.outcome, Outcome::NotInflated);
    let html = report.to_html();
    assert!(
        html.contains("Optimised for selection rate, the winning description did not inflate"),
        "the page must say plainly that it did not inflate"
    );
    assert!(!html.contains("the winning description inflated"));
}

#[tokio::test]
async fn unknown_runs_and_no_runs_are_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(&dir.path().join("t.sqlite").display().to_string())
        .await
        .expect("store");
    let err = Report::load(&store, &["nope".to_string()])
        .await
        .expect_err("unknown run");
    assert!(err.to_string().contains("nope"), "{err}");
    assert!(Report::load(&store, &[]).await.is_err());
    // A batch run from traces has no search to chart: refused by name and kind, not drawn as an empty run.
    store
        .create_run(
            "ft-1",
            tooltune_store::RunKind::FromTraces,
            None,
            Objective::TaskSuccess,
            "{}",
        )
        .await
        .expect("create run");
    let err = Report::load(&store, &["ft-1".to_string()])
        .await
        .expect_err("a from-traces run");
    assert!(
        err.to_string().contains("ft-1") && err.to_string().contains("from-traces"),
        "{err}"
    );
}

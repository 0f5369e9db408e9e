//! The host agent loop end to end with the real local model and real MCP servers: the lecture's reference task over
//! both transports, a third tool added on the server only, and a server killed in the middle of a suite.

use crate::common;

use common::{HttpServer, server_bin, suites_dir, week01_data};
use std::path::Path;
use std::sync::Arc;
use tooltune_core::TrajectoryId;
use tooltune_evaluator::evaluate::{Candidate, EvalOptions, evaluate};
use tooltune_evaluator::{McpServer, ServerSpec, Suite};
use tooltune_llm::{BackendSpec, ChatModel, build};
use tooltune_store::Store;

async fn model(spec: &str) -> Arc<dyn ChatModel> {
    build(&BackendSpec::parse(spec, None).expect("spec"))
        .await
        .expect("the local model loads (fetched on first use)")
}

fn week01_suite() -> Suite {
    // Built before the suite loads: it names the server binary.
    let _ = common::bin_dir();
    Suite::load(suites_dir().join("week01-tools.toml")).expect("suite")
}

async fn store(dir: &Path) -> Store {
    Store::open(&dir.join("t.sqlite").display().to_string())
        .await
        .expect("store")
}

fn only(ids: &[&str]) -> EvalOptions {
    EvalOptions {
        task_ids: ids.iter().map(|s| s.to_string()).collect(),
        target: Some("read_file".into()),
        run_id: Some("test-run".into()),
        candidate_id: Some("seed".into()),
        ..EvalOptions::default()
    }
}

/// The reference task's answer for the kernels this binary was compiled with: llama.cpp's AVX-512 and AVX2 kernels
/// round differently, and the 1.5B's greedy choice of which numbers to add flips with them (measured on both
/// builds, issue 45). The build level, not the CPU, decides: scripts/setup picks it (scripts/cpu-level), and the
/// same flags reach llama.cpp.
fn reference_answer_of_this_build() -> Option<&'static str> {
    if cfg!(target_feature = "avx512f") {
        Some("69504")
    } else if cfg!(target_feature = "avx2") {
        Some("69500")
    } else {
        None
    }
}

/// The lecture's reference task over stdio and over Streamable HTTP with the behaviour model (1.5B): the real
/// server's results reach the model, which reads notes.txt, adds up numbers it read with the calculator and reports
/// the calculator's result. All of this holds on every CPU; which of the numbers it adds does not, and the exact
/// answer is `reference_answer_matches_this_builds_kernels`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_task_over_stdio_and_http() {
    let suite = week01_suite();
    let agent = model("local").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(dir.path()).await;

    let stdio = McpServer::connect(suite.server.clone())
        .await
        .expect("stdio server");
    let mut http_proc = HttpServer::start(
        &server_bin("week01-tools"),
        &[
            "--data",
            week01_data().to_str().expect("path"),
            "--with-list-files",
        ],
    );
    let http = McpServer::connect(ServerSpec::http("week01-http", http_proc.url.clone()))
        .await
        .expect("http server");

    for (name, server) in [("stdio", &stdio), ("http", &http)] {
        let r = evaluate(
            &suite,
            server,
            agent.as_ref(),
            Some(&store),
            &Candidate::default(),
            &only(&["notes-sum"]),
            |_, _| {},
        )
        .await
        .expect("evaluate");
        let t = &r.tasks[0];
        assert_eq!(t.infra_failure, None, "{name}");
        // The lecture's run, solved end to end: read_file once on notes.txt, then the calculator once on a sum of
        // the numbers it read, and an answer that reports the calculator's real result.
        assert_eq!(t.called, ["read_file", "calculator"], "{name}: {t:?}");
        let id = TrajectoryId::from_stored(t.trajectory_id.clone().expect("stored"));
        let stored = store.trajectory(&id).await.expect("load").expect("present");
        let expression = stored
            .tool_calls()
            .find(|c| c.name == "calculator")
            .and_then(|c| c.arguments["expression"].as_str().map(str::to_string))
            .expect("a calculator call with an expression");
        let operands: Vec<u64> = expression
            .split('+')
            .map(|x| x.trim().parse().expect("a sum of whole numbers"))
            .collect();
        for amount in [48000, 9500, 12000] {
            assert!(operands.contains(&amount), "{name}: {expression}");
        }
        assert!(
            operands.iter().all(|n| [4, 48000, 9500, 12000].contains(n)),
            "{name}: {expression} adds a number that is not in notes.txt"
        );
        let result = stored
            .steps
            .iter()
            .find_map(|s| match s {
                tooltune_core::Step::ToolResult { name, content, .. } if name == "calculator" => {
                    Some(content.clone())
                }
                _ => None,
            })
            .expect("the calculator's result");
        assert!(
            t.final_answer.as_deref().unwrap_or("").contains(&result),
            "{name}: the answer does not report the calculator's {result}: {t:?}"
        );
        if !t.success {
            // Expected on AVX2 builds (see the next test); reported so a run shows which sum it made.
            eprintln!("{name}: the suite's check says: {}", t.feedback);
        }
        // The exact first-call probability favours read_file for this task.
        let p = t
            .first_call_probabilities
            .as_ref()
            .expect("the local backend scores exactly");
        assert!(p["read_file"] > 0.5, "{name}: {p:?}");
        // The rollout is stored as a trajectory linked to its run and candidate, with the real tool results.
        assert_eq!(stored.links.run_id.as_deref(), Some("test-run"));
        assert_eq!(stored.links.candidate_id.as_deref(), Some("seed"));
        assert!(
            stored.steps.iter().any(|s| matches!(s,
                tooltune_core::Step::ToolResult { name, content, .. }
                    if name == "read_file" && content.contains("Pizza budget: 48000"))),
            "{name}: {:?}",
            stored.steps
        );
        // Every call has its own id, so each result answers exactly one call.
        let mut ids = std::collections::HashSet::new();
        for s in &stored.steps {
            if let tooltune_core::Step::Model { tool_calls, .. } = s {
                for c in tool_calls {
                    let id = c.id.clone().expect("the host gives every call an id");
                    assert!(ids.insert(id.clone()), "{name}: call id {id} repeated");
                }
            }
        }
    }
    http.shutdown().await;
    http_proc.kill();
    stdio.shutdown().await;
}

/// The reference task's exact answer on each build we ship, over stdio: 69504 on an AVX-512 build (all four
/// numbers in notes.txt, the attendee count included, which the suite's check requires), 69500 on an AVX2 build
/// (the three amounts; the check then fails and says so).
///
/// Whether the 1.5B adds the attendee count too is a close call under greedy decoding, and llama.cpp's kernels
/// round differently by instruction set, so the greedy choice flips between the two builds; each is held here so
/// that a change of kernels or build flags that moves it is seen. On a build that is neither (baseline x86-64,
/// another architecture) it checks nothing and says so; `reference_task_over_stdio_and_http` holds what every
/// build must do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_answer_matches_this_builds_kernels() {
    let Some(expected) = reference_answer_of_this_build() else {
        eprintln!(
            "this build is neither AVX-512 nor AVX2: its reference answer was never measured"
        );
        return;
    };
    let suite = week01_suite();
    let agent = model("local").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(dir.path()).await;
    let server = McpServer::connect(suite.server.clone())
        .await
        .expect("stdio server");
    let r = evaluate(
        &suite,
        &server,
        agent.as_ref(),
        Some(&store),
        &Candidate::default(),
        &only(&["notes-sum"]),
        |_, _| {},
    )
    .await
    .expect("evaluate");
    let t = &r.tasks[0];
    assert_eq!(t.infra_failure, None);
    assert!(
        t.final_answer.as_deref().unwrap_or("").contains(expected),
        "expected {expected} on this build: {t:?}"
    );
    // The suite's check asks for all four numbers: only the AVX-512 build's sum passes it.
    assert_eq!(t.success, expected == "69504", "{}", t.feedback);
    server.shutdown().await;
}

/// A third tool added on the server only (its `--with-list-files` switch) is listed and used by the host, whose
/// code names no tool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_added_on_the_server_only_is_used() {
    let suite = week01_suite();
    let agent = model("local").await;
    let bin = server_bin("week01-tools");
    let data = week01_data().display().to_string();
    let without = McpServer::connect(ServerSpec::stdio("w", &bin, &["--data", &data]))
        .await
        .expect("server without the third tool");
    assert!(
        !without
            .list_tools()
            .await
            .expect("list")
            .iter()
            .any(|t| t.name == "list_files")
    );
    let with = McpServer::connect(ServerSpec::stdio(
        "w3",
        &bin,
        &["--data", &data, "--with-list-files"],
    ))
    .await
    .expect("server with the third tool");
    let r = evaluate(
        &suite,
        &with,
        agent.as_ref(),
        None,
        &Candidate::default(),
        &EvalOptions {
            target: Some("list_files".into()),
            ..only(&["list-folders"])
        },
        |_, _| {},
    )
    .await
    .expect("evaluate");
    assert_eq!(
        r.tasks[0].called.first().map(String::as_str),
        Some("list_files"),
        "{:?}",
        r.tasks[0]
    );
    without.shutdown().await;
    with.shutdown().await;
}

/// A server killed with SIGKILL while a suite runs: the suite finishes, the rollout that hit the dead server is
/// marked as an infrastructure failure (not the candidate's), the server is restarted, and what was stored before
/// stays stored. Mechanics only, so the fast model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_suite_is_marked_and_restarted() {
    let suite = week01_suite();
    let agent = model("local:fast").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(dir.path()).await;
    let server = McpServer::connect(suite.server.clone())
        .await
        .expect("server");
    let pid = server.pid().await.expect("child pid");
    let ids = ["calc-mul-add", "calc-div", "calc-mixed", "calc-fraction"];
    let killed = std::sync::atomic::AtomicBool::new(false);
    let opts = EvalOptions {
        batch: 1,
        target: Some("calculator".into()),
        ..only(&ids)
    };
    let r = evaluate(
        &suite,
        &server,
        agent.as_ref(),
        Some(&store),
        &Candidate::default(),
        &opts,
        |done, _| {
            // After the first task is stored, kill the server before the second one runs.
            if done == 1 && !killed.swap(true, std::sync::atomic::Ordering::SeqCst) {
                let status = std::process::Command::new("kill")
                    .args(["-9", &pid.to_string()])
                    .status()
                    .expect("kill runs");
                assert!(status.success());
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
        },
    )
    .await
    .expect("the suite finishes");
    assert_eq!(r.tasks.len(), 4);
    assert_eq!(r.tasks[0].infra_failure, None, "{:?}", r.tasks[0]);
    // The first task after the kill that calls a tool meets the dead server; the ones after it run on the
    // restarted one.
    let failed_at: Vec<usize> = (0..4)
        .filter(|&i| r.tasks[i].infra_failure.is_some())
        .collect();
    assert_eq!(failed_at.len(), 1, "{:?}", r.tasks);
    assert!(failed_at[0] < 3, "{:?}", r.tasks);
    let failed = [&r.tasks[failed_at[0]]];
    assert_eq!(r.infra_failures, 1);
    assert_eq!(
        r.tasks[failed_at[0] + 1].infra_failure,
        None,
        "{:?}",
        r.tasks
    );
    assert_ne!(server.pid().await, Some(pid));
    // Every rollout is stored, the failed one with no verdict (it says nothing about the candidate).
    assert_eq!(store.count_trajectories().await.expect("count"), 4);
    let failed_id = TrajectoryId::from_stored(failed[0].trajectory_id.clone().expect("id"));
    let t = store
        .trajectory(&failed_id)
        .await
        .expect("load")
        .expect("present");
    assert_eq!(t.outcome.success, None);
    assert!(
        t.outcome
            .feedback
            .as_deref()
            .unwrap_or("")
            .contains("infrastructure")
    );
    server.shutdown().await;
}

/// A backend that cannot score first moves exactly (OpenAI-compatible: here the embedded 0.5B behind `model serve`,
/// reached over HTTP) gets them estimated from sampled first turns, and says so: each task's probabilities count
/// `first_move_samples` draws, and the suite's expected routing carries a 95% interval around it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hosted_backend_screens_by_sampled_first_moves_with_an_interval() {
    let local = model("local:fast").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        tooltune_llm::serve::serve(listener, local, "served")
            .await
            .expect("serve")
    });
    let hosted = model(&format!("openai:served@http://{addr}/v1")).await;
    let _ = common::bin_dir();
    let suite = Suite::load(suites_dir().join("contractor-small.toml")).expect("suite");
    let server = McpServer::connect(suite.server.clone())
        .await
        .expect("server");
    let samples = 4;
    let ids = ["docs-coverage", "web-nairobi-uv"];
    let opts = EvalOptions {
        mode: tooltune_evaluator::evaluate::Mode::SelectionOnly,
        first_move_samples: samples,
        target: Some("search_docs".into()),
        ..only(&ids)
    };
    let r = evaluate(
        &suite,
        &server,
        hosted.as_ref(),
        None,
        &Candidate::default(),
        &opts,
        |_, _| {},
    )
    .await
    .expect("evaluates");
    assert_eq!(r.tasks.len(), ids.len());
    for t in &r.tasks {
        assert!(t.infra_failure.is_none(), "{t:?}");
        assert_eq!(t.first_move_samples, Some(samples), "{t:?}");
        let p = t.first_call_probabilities.as_ref().expect("estimated");
        let no_call = t.no_call_probability.expect("estimated");
        // Shares of four draws: multiples of a quarter, summing to at most 1 (a call of an unoffered name is
        // none of the moves).
        for v in p.values().chain(std::iter::once(&no_call)) {
            assert!((v * 4.0 - (v * 4.0).round()).abs() < 1e-9, "{v} in {t:?}");
        }
        assert!(p.values().sum::<f64>() + no_call <= 1.0 + 1e-9);
    }
    assert_eq!(r.first_move_samples, Some(samples));
    let e = r.expected_routing.expect("estimated routing");
    let (lo, hi) = r.expected_routing_interval.expect("an interval");
    assert!(lo <= e && e <= hi && hi - lo > 0.0, "{lo} {e} {hi}");
}

/// Checks what every task's expected success must satisfy: the greedy rollout is its first branch, every other
/// branch called the tool imposed on it first (or, cut at the token limit, none; at least one made its call), the
/// branches and what was not played cover the whole
/// first-move distribution, and the value is the probability of the branches that succeeded.
fn check_branches(r: &tooltune_evaluator::evaluate::SuiteResult) {
    use tooltune_evaluator::host::ForcedMove;
    for t in &r.tasks {
        assert!(t.infra_failure.is_none(), "{t:?}");
        let e = t.expected_success.as_ref().expect("measured");
        let greedy = &e.branches[0];
        assert!(greedy.greedy, "{e:?}");
        assert_eq!(greedy.success, t.success);
        assert_eq!(greedy.called, t.called);
        for b in &e.branches[1..] {
            assert!(!b.greedy);
            match &b.first_move {
                // A call cut at the token limit is no call (the 0.5B, made to search the web for Porto's
                // weather, writes "Porto, Porto, ..." until the limit), but never a call of another tool.
                ForcedMove::Tool(name) => assert!(
                    b.called.is_empty() || b.called.first() == Some(name),
                    "{} {b:?}",
                    t.task_id
                ),
                ForcedMove::NoCall => assert!(b.called.is_empty(), "{} {b:?}", t.task_id),
            }
            assert!(b.probability >= tooltune_evaluator::evaluate::MIN_BRANCH_PROBABILITY);
        }
        let covered: f64 = e.branches.iter().map(|b| b.probability).sum();
        assert!((covered + e.unplayed - 1.0).abs() < 1e-6, "{e:?}");
        let won: f64 = e
            .branches
            .iter()
            .filter(|b| b.success)
            .map(|b| b.probability)
            .sum();
        assert!((e.value - won).abs() < 1e-9, "{e:?}");
    }
    assert!(r.expected_success.is_some());
    let imposed_and_made = r
        .tasks
        .iter()
        .flat_map(|t| &t.expected_success.as_ref().expect("measured").branches)
        .filter(|b| {
            matches!(&b.first_move, ForcedMove::Tool(n) if !b.greedy && b.called.first() == Some(n))
        })
        .count();
    assert!(imposed_and_made > 0, "an imposed call was made: {r:?}");
}

/// Expected success with the real 0.5B on the contractor server: every likely first move is played out (see
/// `check_branches`), and an evaluation compared with a repeat of itself differs on no task in any measure
/// (greedy decoding, forced or not, is reproducible).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expected_success_plays_out_every_likely_first_move_and_a_repeat_compares_equal() {
    let agent = model("local:fast").await;
    let _ = common::bin_dir();
    let suite = Suite::load(suites_dir().join("contractor-small.toml")).expect("suite");
    let server = McpServer::connect(suite.server.clone())
        .await
        .expect("server");
    let opts = EvalOptions {
        expected_success: true,
        target: Some("search_docs".into()),
        ..only(&["docs-coverage", "web-nairobi-uv", "web-porto"])
    };
    let mut runs = Vec::new();
    for _ in 0..2 {
        let r = evaluate(
            &suite,
            &server,
            agent.as_ref(),
            None,
            &Candidate::default(),
            &opts,
            |_, _| {},
        )
        .await
        .expect("evaluates");
        check_branches(&r);
        // Branch rollouts are not the candidate's rollouts: only the greedy ones are kept.
        assert_eq!(r.trajectories.len(), 3);
        runs.push(r);
    }
    let branches: usize = runs[0]
        .tasks
        .iter()
        .map(|t| t.expected_success.as_ref().map_or(0, |e| e.branches.len()))
        .sum();
    assert!(branches > 3, "the 0.5B is unsure of every task: {branches}");
    let c = tooltune_evaluator::compare::compare(&runs[0], &runs[1]).expect("comparable");
    assert_eq!(c.tasks, 3);
    for m in [&c.success, &c.expected_success, &c.routing, &c.selection] {
        let m = m.as_ref().expect("measured on both sides");
        assert_eq!((m.better, m.worse, m.p_value), (0, 0, 1.0), "{c:?}");
    }
}

/// With a fixture every branch rollout gets its own copy, as a greedy one does: branches that only read find their
/// copy unchanged beside branches that wrote to theirs, and the fixture itself stays as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn branch_rollouts_of_a_suite_with_a_fixture_each_run_on_their_own_copy() {
    let agent = model("local:fast").await;
    let dir = tempfile::tempdir().expect("tmp");
    let suite = common::notes_suite(dir.path(), true, common::NOTES_TASKS);
    let source = common::workspace().join("evaluator/tests/fixtures/notes");
    let before = tooltune_evaluator::fixture::digest(&source).expect("digest");
    let server = suite.connect().await.expect("connect");
    let opts = EvalOptions {
        expected_success: true,
        target: Some("read_note".into()),
        ..only(&["delete-beta", "how-many", "beta-state"])
    };
    let r = evaluate(
        &suite,
        &server,
        agent.as_ref(),
        None,
        &Candidate::default(),
        &opts,
        |_, _| {},
    )
    .await
    .expect("evaluates");
    server.shutdown().await;
    assert!(r.fixture);
    check_branches(&r);
    // `delete_note` and `count_notes` (which keeps an access log) change a copy; a branch that called neither
    // finds its copy unchanged although branches that wrote ran beside it, which a shared world would not show.
    let branches: Vec<_> = r
        .tasks
        .iter()
        .flat_map(|t| &t.expected_success.as_ref().expect("measured").branches)
        .collect();
    assert!(
        branches.iter().any(|b| b.changed_fixture == Some(true)),
        "some branch changed its copy: {branches:?}"
    );
    for b in &branches {
        let writes = b
            .called
            .iter()
            .any(|c| c == "delete_note" || c == "count_notes");
        if !writes {
            assert_eq!(b.changed_fixture, Some(false), "{b:?}");
        }
    }
    assert_eq!(
        tooltune_evaluator::fixture::digest(&source).expect("digest"),
        before,
        "the fixture is untouched"
    );
}

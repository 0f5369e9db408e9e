//! Servers that write: every rollout starts from a fresh copy of the suite's fixture, a tool that claims to be
//! read-only and writes is caught by the fixture's digest, side-effecting calls without a fixture are reported,
//! and the bundled writing suites are solvable (their reference calls pass their checks on a fresh copy each).
//!
//! The agent here is a scripted fake (it makes the calls a test needs, so the test checks the machinery and not
//! a model's choices); the servers are real: a Python server of our own that lies about one tool, and the npm
//! filesystem and memory servers.

use crate::common;

use async_trait::async_trait;
use common::{suites_dir, third_party, workspace};
use std::path::{Path, PathBuf};
use tooltune_core::{ToolCall, Usage};
use tooltune_evaluator::evaluate::{Candidate, EvalOptions, evaluate};
use tooltune_evaluator::fixture::{self, Workspace};
use tooltune_evaluator::{Suite, Task};
use tooltune_llm::{ChatModel, ChatRequest, ChatResponse, FinishReason, LlmError, Message};

/// A scripted fake agent: for a task whose prompt names a tool as `call TOOL {json}`, its first turn calls that
/// tool with those arguments; after a tool result it answers with the result's text. Stateless (it reads the
/// conversation), so rollouts run together get the same replies as alone.
struct ScriptedFakeAgent;

#[async_trait]
impl ChatModel for ScriptedFakeAgent {
    fn id(&self) -> String {
        "fake:scripted-fixture-agent".into()
    }

    async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let reply = |content: Option<String>, call: Option<ToolCall>| ChatResponse {
            content,
            tool_calls: call.into_iter().collect(),
            usage: Usage::default(),
            finish_reason: FinishReason::Stop,
        };
        match req.messages.last() {
            Some(Message::Tool { content, .. }) => Ok(reply(Some(content.clone()), None)),
            Some(Message::User { content }) => {
                let Some(rest) = content.strip_prefix("call ") else {
                    return Ok(reply(Some("no call".into()), None));
                };
                let (name, args) = rest.split_once(' ').unwrap_or((rest, "{}"));
                Ok(reply(
                    None,
                    Some(ToolCall {
                        id: None,
                        name: name.to_string(),
                        arguments: serde_json::from_str(args).expect("scripted arguments are JSON"),
                    }),
                ))
            }
            _ => Ok(reply(Some("done".into()), None)),
        }
    }

    fn usage_total(&self) -> Usage {
        Usage::default()
    }
}

const DELETE_THEN_READ: &str = r#"
[[task]]
id = "delete-alpha"
prompt = 'call delete_note {"name": "alpha"}'
split = "test"
owner = "delete_note"
expect_file = [{ path = "notes/alpha.txt", exists = false }]

[[task]]
id = "read-alpha"
prompt = 'call read_note {"name": "alpha"}'
split = "test"
owner = "read_note"
answer.contains = "2026-10-20"
"#;

fn opts(batch: usize) -> EvalOptions {
    EvalOptions {
        batch,
        ..EvalOptions::default()
    }
}

#[tokio::test]
async fn a_rollout_that_deletes_data_leaves_the_next_rollout_of_the_same_task_its_world() {
    let dir = tempfile::tempdir().expect("dir");
    let suite = common::notes_suite(dir.path(), true, DELETE_THEN_READ);
    let server = suite.connect().await.expect("connect");
    let only_delete = EvalOptions {
        task_ids: vec!["delete-alpha".into()],
        ..opts(1)
    };
    // The same task twice: each rollout finds the note, deletes it, and is scored on its own copy.
    for round in 0..2 {
        let r = evaluate(
            &suite,
            &server,
            &ScriptedFakeAgent,
            None,
            &Candidate::default(),
            &only_delete,
            |_, _| {},
        )
        .await
        .expect("evaluate");
        let t = &r.tasks[0];
        assert_eq!(
            t.final_answer.as_deref(),
            Some("deleted alpha"),
            "round {round}"
        );
        assert!(t.success, "round {round}: {}", t.feedback);
        assert_eq!(t.changed_fixture, Some(true));
        assert_eq!(t.side_effect_calls, ["delete_note"]);
        assert!(t.read_only_violations.is_empty());
        assert!(r.fixture && r.order_warning().is_none());
    }
    // Then both tasks together, one batch: the read sees the note the delete removed from its own copy.
    let r = evaluate(
        &suite,
        &server,
        &ScriptedFakeAgent,
        None,
        &Candidate::default(),
        &opts(8),
        |_, _| {},
    )
    .await
    .expect("evaluate");
    assert!(r.tasks.iter().all(|t| t.success), "{:?}", r.tasks);
    assert_eq!(r.tasks[1].changed_fixture, Some(false));
    // The fixture itself was never touched.
    assert!(
        workspace()
            .join("evaluator/tests/fixtures/notes/notes/alpha.txt")
            .exists()
    );
    server.shutdown().await;
}

#[tokio::test]
async fn without_a_fixture_the_delete_reaches_the_next_rollout_and_the_warning_names_the_tool() {
    let dir = tempfile::tempdir().expect("dir");
    let suite = common::notes_suite(
        dir.path(),
        false,
        DELETE_THEN_READ
            .replace(
                "expect_file = [{ path = \"notes/alpha.txt\", exists = false }]",
                "expect_tools = [\"delete_note\"]",
            )
            .as_str(),
    );
    let server = suite.connect().await.expect("connect");
    // One at a time, in file order: the read comes after the delete on the same folder.
    let r = evaluate(
        &suite,
        &server,
        &ScriptedFakeAgent,
        None,
        &Candidate::default(),
        &opts(1),
        |_, _| {},
    )
    .await
    .expect("evaluate");
    assert!(r.tasks[0].success);
    // This is what a fixture prevents: the read found the note gone.
    assert!(!r.tasks[1].success, "{:?}", r.tasks[1]);
    assert_eq!(
        r.tasks[1].final_answer.as_deref(),
        Some("no note named alpha")
    );
    assert!(!r.fixture);
    assert_eq!(r.side_effect_tools, ["delete_note"]);
    let warning = r.order_warning().expect("a warning");
    assert!(warning.contains("`delete_note`"), "{warning}");
    server.shutdown().await;
}

#[tokio::test]
async fn a_tool_that_claims_read_only_and_writes_is_named_by_the_digest_check() {
    let dir = tempfile::tempdir().expect("dir");
    let suite = common::notes_suite(
        dir.path(),
        true,
        r#"
[[task]]
id = "count"
prompt = 'call count_notes {}'
split = "test"
owner = "count_notes"
answer.contains = "2"

[[task]]
id = "read-beta"
prompt = 'call read_note {"name": "beta"}'
split = "test"
owner = "read_note"
answer.contains = "paused"
"#,
    );
    let server = suite.connect().await.expect("connect");
    // The hints come with the tool list.
    server.list_tools().await.expect("list");
    let hints = server.hints();
    assert_eq!(hints["count_notes"].read_only_hint, Some(true));
    assert_eq!(hints["delete_note"].destructive_hint, Some(true));
    let store = tooltune_store::Store::open(&dir.path().join("t.sqlite").display().to_string())
        .await
        .expect("store");
    let r = evaluate(
        &suite,
        &server,
        &ScriptedFakeAgent,
        Some(&store),
        &Candidate::default(),
        &opts(8),
        |_, _| {},
    )
    .await
    .expect("evaluate");
    let count = &r.tasks[0];
    assert!(count.success, "{}", count.feedback);
    assert!(count.side_effect_calls.is_empty());
    assert_eq!(count.changed_fixture, Some(true));
    assert_eq!(count.read_only_violations, ["count_notes"]);
    // The honest read-only tool is not accused.
    assert_eq!(r.tasks[1].changed_fixture, Some(false));
    assert!(r.tasks[1].read_only_violations.is_empty());
    assert_eq!(r.read_only_violations, ["count_notes"]);
    // The stored rollout keeps the server's claims beside what the digest found, for every tool shown.
    let id = tooltune_core::TrajectoryId::from_stored(count.trajectory_id.clone().expect("an id"));
    let stored = store.trajectory(&id).await.expect("load").expect("stored");
    assert_eq!(stored.id(), id);
    let claims = &stored.tool_annotations;
    assert_eq!(claims["count_notes"].read_only_hint, Some(true));
    assert_eq!(claims["count_notes"].open_world_hint, Some(false));
    assert_eq!(claims["delete_note"].destructive_hint, Some(true));
    let mut shown: Vec<&String> = stored.tools.iter().map(|t| &t.name).collect();
    shown.sort();
    assert_eq!(
        claims.keys().collect::<Vec<_>>(),
        shown,
        "one entry per tool shown: the server declares hints for each"
    );
    store.close().await;
    server.shutdown().await;
}

/// Runs each task's reference calls on a fresh copy and checks the task's fixture checks and answer there.
async fn references_pass_on_fresh_copies(suite: &Suite) {
    let f = suite
        .fixture
        .as_ref()
        .expect("a writing suite has a fixture");
    let mut problems = Vec::new();
    for task in &suite.tasks {
        let w = Workspace::open(f, &suite.server, None)
            .await
            .expect("workspace");
        let mut last = String::new();
        for call in &task.reference {
            let r = w
                .server
                .call_tool(&call.tool, call.arguments.clone(), common::CALL)
                .await
                .unwrap_or_else(|e| panic!("task {}: {e}", task.id));
            if r.is_error {
                problems.push(format!(
                    "task {}: {} failed: {}",
                    task.id, call.tool, r.content_text
                ));
            }
            last = r.content_text;
        }
        problems.extend(failures(task, &last, w.dir()).await);
        w.close().await;
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

async fn failures(task: &Task, last: &str, dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = fixture::check_world(task, dir)
        .await
        .into_iter()
        .filter(|(ok, _)| !ok)
        .map(|(_, what)| format!("task {}: {what}", task.id))
        .collect();
    if let Some(a) = &task.answer
        && !a.found_in(last)
    {
        out.push(format!("task {}: {} not in {last}", task.id, a.describe()));
    }
    out
}

#[tokio::test]
async fn the_writing_filesystem_suite_is_solvable_on_fresh_copies() {
    third_party();
    let suite = Suite::load(suites_dir().join("server-filesystem-write.toml")).expect("suite");
    let server = suite.connect().await.expect("connect");
    suite
        .check_tool_names(&server.list_tools().await.expect("list"))
        .expect("names");
    // The write tools are visible and declared as such.
    let hints = server.hints();
    assert_eq!(hints["write_file"].read_only_hint, Some(false));
    assert_eq!(hints["read_text_file"].read_only_hint, Some(true));
    server.shutdown().await;
    references_pass_on_fresh_copies(&suite).await;
}

#[tokio::test]
async fn the_memory_suite_is_solvable_on_fresh_copies() {
    third_party();
    let suite = Suite::load(suites_dir().join("server-memory.toml")).expect("suite");
    assert!(suite.tasks.len() >= 12);
    let server = suite.connect().await.expect("connect");
    suite
        .check_tool_names(&server.list_tools().await.expect("list"))
        .expect("names");
    server.shutdown().await;
    references_pass_on_fresh_copies(&suite).await;
    // The fixture file is as shipped: nothing above wrote to it.
    let source: PathBuf = suite.fixture.as_ref().expect("fixture").source.clone();
    assert_eq!(
        fixture::Fixture::load(source).expect("fixture").digest,
        suite.fixture.as_ref().expect("fixture").digest
    );
}

//! The bundled suites: they load, their tool names exist on their servers, and every task's answer is
//! really obtainable there: the reference calls (the "obvious" calls) return it, and for the contractor
//! suite the competing tool's result with the same query does not.

use crate::common;

use common::{CALL, bin_dir, suites_dir, third_party};
use std::collections::BTreeMap;
use tooltune_evaluator::{EvalError, McpServer, Split, Suite};

fn load(name: &str) -> Suite {
    Suite::load(suites_dir().join(name)).unwrap_or_else(|e| panic!("{e}"))
}

fn split_shares(suite: &Suite) -> BTreeMap<Split, f64> {
    let n = suite.tasks.len() as f64;
    let mut m = BTreeMap::new();
    for t in &suite.tasks {
        *m.entry(t.split).or_insert(0.0) += 1.0 / n;
    }
    m
}

/// Runs every task's reference calls; returns the text of the last call for each task.
async fn run_references(suite: &Suite, server: &McpServer) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for task in &suite.tasks {
        assert!(
            !task.reference.is_empty(),
            "task {} has no reference",
            task.id
        );
        let mut last = String::new();
        for call in &task.reference {
            let r = server
                .call_tool(&call.tool, call.arguments.clone(), CALL)
                .await
                .unwrap_or_else(|e| panic!("task {}: {e}", task.id));
            assert!(
                !r.is_error,
                "task {}: {} failed: {}",
                task.id, call.tool, r.content_text
            );
            last = r.content_text;
        }
        let answer = task
            .answer
            .as_ref()
            .expect("every bundled task checks its answer");
        assert!(
            answer.found_in(&last),
            "task {}: expected {} in the reference result:\n{last}",
            task.id,
            answer.describe()
        );
        out.push((task.id.clone(), last));
    }
    out
}

#[test]
fn every_bundled_suite_loads_with_sane_splits() {
    let mut names: Vec<_> = std::fs::read_dir(suites_dir())
        .expect("suites dir")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".toml"))
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec![
            "contractor-small.toml",
            "contractor.toml",
            "mcp-server-time.toml",
            "server-filesystem-write.toml",
            "server-filesystem.toml",
            "server-memory.toml",
            "week01-tools.toml"
        ]
    );
    for name in &names {
        let suite = load(name);
        let shares = split_shares(&suite);
        for split in [Split::Train, Split::Validation, Split::Test] {
            let s = shares.get(&split).copied().unwrap_or(0.0);
            assert!((0.2..=0.5).contains(&s), "{name}: {split} share {s:.2}");
        }
    }
    let week01 = load("week01-tools.toml");
    assert!(week01.tasks.len() >= 31, "{}", week01.tasks.len());
    let reference = week01
        .task("notes-sum")
        .expect("the lecture's reference task");
    assert_eq!(
        reference.prompt,
        "Read notes.txt and sum the numbers in it."
    );
    assert_eq!(reference.expect_tools, vec!["read_file", "calculator"]);
    assert_eq!(
        reference.answer.as_ref().and_then(|a| a.number),
        Some(69504.0)
    );
    assert!(
        reference
            .check(Some("69504"), &["read_file", "calculator"])
            .success
    );

    let contractor = load("contractor.toml");
    assert!(contractor.tasks.len() >= 40, "{}", contractor.tasks.len());
    assert_eq!(contractor.tools_under_study, vec!["search_docs"]);
    let docs = contractor
        .tasks
        .iter()
        .filter(|t| t.owner.as_deref() == Some("search_docs"))
        .count();
    let web = contractor
        .tasks
        .iter()
        .filter(|t| t.owner.as_deref() == Some("web_search"))
        .count();
    assert_eq!(docs + web, contractor.tasks.len());
    assert!(docs.abs_diff(web) <= 4, "docs {docs}, web {web}");
}

#[test]
fn a_malformed_suite_file_is_named_with_task_and_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("broken.toml");
    let text = std::fs::read_to_string(suites_dir().join("week01-tools.toml"))
        .expect("read")
        .replacen("answer.number = 395", "answer.numbr = 395", 1);
    std::fs::write(&path, text).expect("write");
    let e = Suite::load(&path).expect_err("malformed");
    let msg = e.to_string();
    assert!(matches!(e, EvalError::Suite { .. }), "{msg}");
    assert!(msg.contains("broken.toml:"), "{msg}");
    assert!(msg.contains("task `calc-mul-add` (#2)"), "{msg}");
    assert!(msg.contains("numbr"), "{msg}");
    println!("{msg}");
}

#[tokio::test]
async fn week01_answers_come_from_the_reference_calls() {
    bin_dir();
    let suite = load("week01-tools.toml");
    let server = McpServer::connect(suite.server.clone())
        .await
        .expect("connect");
    let tools = server.list_tools().await.expect("list");
    suite.check_tool_names(&tools).expect("names");
    run_references(&suite, &server).await;
}

#[tokio::test]
async fn contractor_answers_exist_only_in_the_owner_tools_corpus() {
    bin_dir();
    let suite = load("contractor.toml");
    let server = McpServer::connect(suite.server.clone())
        .await
        .expect("connect");
    let tools = server.list_tools().await.expect("list");
    suite.check_tool_names(&tools).expect("names");
    run_references(&suite, &server).await;
    // All problems at once: a corpus edit tends to break several tasks.
    let mut problems = Vec::new();
    for task in &suite.tasks {
        let owner = task.owner.as_deref().expect("owner");
        let answer = task.answer.as_ref().expect("answer");
        // The task's own wording as the query also finds it with the owner tool.
        let own = server
            .call_tool(owner, serde_json::json!({ "query": task.prompt }), CALL)
            .await
            .expect("call");
        if !answer.found_in(&own.content_text) {
            problems.push(format!(
                "task {}: the prompt as a {owner} query misses {}:\n{}",
                task.id,
                answer.describe(),
                own.content_text
            ));
        }
        // Neither the reference query nor the prompt finds it with any competing tool.
        for other in tools.iter().filter(|t| t.name != owner) {
            let queries = task
                .reference
                .iter()
                .map(|r| r.arguments.clone())
                .chain([serde_json::json!({ "query": task.prompt })]);
            for args in queries {
                let r = server
                    .call_tool(&other.name, args.clone(), CALL)
                    .await
                    .expect("call");
                if answer.found_in(&r.content_text) {
                    problems.push(format!(
                        "task {}: {} also yields {} for {args}:\n{}",
                        task.id,
                        other.name,
                        answer.describe(),
                        r.content_text
                    ));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

#[tokio::test]
async fn time_suite_answers_come_from_the_real_server() {
    third_party();
    let suite = load("mcp-server-time.toml");
    let server = McpServer::connect(suite.server.clone())
        .await
        .expect("connect");
    suite
        .check_tool_names(&server.list_tools().await.expect("list"))
        .expect("names");
    run_references(&suite, &server).await;
}

#[tokio::test]
async fn filesystem_suite_answers_come_from_the_real_server() {
    third_party();
    let suite = load("server-filesystem.toml");
    let server = McpServer::connect(suite.server.clone())
        .await
        .expect("connect");
    let tools = server.list_tools().await.expect("list");
    suite.check_tool_names(&tools).expect("names");
    let visible = suite.visible_tools(tools.clone());
    assert_eq!(visible.len(), tools.len() - 4);
    assert!(visible.iter().all(|t| t.name != "write_file"));
    run_references(&suite, &server).await;
}

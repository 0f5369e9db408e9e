//! `Store::logged_runs`, what `suite from-traces` reads, on both backends: logs only (never the evaluator's
//! rollouts), in log order, filtered by start time, tools shown and verdict source, each with its verdict.

use serde_json::json;
use tooltune_core::Trajectory;
use tooltune_store::{LabelSource, LabelUse, LoggedFilter, NewLabel, Store};

fn trajectory(task: &str, called: &[&str], success: bool, docs_description: &str) -> Trajectory {
    let steps: Vec<_> = called
        .iter()
        .enumerate()
        .flat_map(|(i, name)| {
            [
                json!({"type": "model", "tool_calls": [{"id": format!("c{i}"), "name": name, "arguments": {"q": task}}]}),
                json!({"type": "tool_result", "call_id": format!("c{i}"), "name": name, "content": "result"}),
            ]
        })
        .collect();
    serde_json::from_value(json!({
        "task": task,
        "tools": [
            {"name": "search_docs", "description": docs_description, "input_schema": {"type": "object"}},
            {"name": "web_search", "description": "Search the web.", "input_schema": {"type": "object"}}
        ],
        "steps": steps,
        "final_answer": "done",
        "outcome": {"success": success},
        "meta": {"source": "tooltune"}
    }))
    .expect("test trajectory")
}

/// `logged_runs`, what `suite from-traces` reads: logs only (never the evaluator's rollouts), the run's own start
/// time (else its ingest time) against `since`/`until` (a date includes its day), the tools shown, and the verdict
/// with its source (a label only where the producer wrote none, and only when labels are used).
async fn logged_runs_filter_by_time_tool_and_verdict_source(s: Store) {
    let mut ts: Vec<Trajectory> = [
        "retry limit",
        "sync_orders",
        "weather",
        "runbook",
        "World Cup",
    ]
    .iter()
    .zip([true, false, true, false, false])
    .map(|(task, ok)| trajectory(task, &["web_search"], ok, "Search internal docs."))
    .collect();
    for (t, day) in ts.iter_mut().zip(["01", "02", "02", "03", "04"]) {
        t.meta.started_at = Some(format!("2025-06-{day}T09:00:00Z"));
    }
    let mut unjudged = trajectory(
        "no outcome",
        &["search_docs"],
        true,
        "Search internal docs.",
    );
    unjudged.outcome = Default::default();
    unjudged.meta.started_at = Some("2025-06-02T23:59:59Z".into());
    ts.push(unjudged);
    let mut rollout = trajectory("a rollout", &["search_docs"], true, "Search internal docs.");
    rollout.meta.source = "evaluator".into();
    ts.push(rollout);
    s.insert(&ts).await.expect("insert");
    s.save_labels(&[NewLabel {
        trajectory_id: ts[5].id().to_string(),
        source: LabelSource::Judge,
        model: "judge-model".into(),
        score: Some(1.0),
        success: true,
        feedback: "answers".into(),
        detail: None,
    }])
    .await
    .expect("label");
    let all = LoggedFilter {
        limit: 100,
        ..Default::default()
    };
    let ids =
        |v: &[tooltune_store::LoggedVerdict]| v.iter().map(|r| r.id.clone()).collect::<Vec<_>>();

    let got = s.logged_runs(&all).await.expect("all");
    assert_eq!(
        ids(&got),
        ts[..6].iter().map(|t| t.id()).collect::<Vec<_>>(),
        "in log order, no rollout"
    );
    assert_eq!(got[0].success, Some(true));
    assert_eq!(got[1].success, Some(false));
    assert_eq!(
        got[5].success,
        Some(true),
        "the judge's label where no outcome was written"
    );
    assert_eq!(got[5].verdict_source.as_deref(), Some("judge"));
    assert_eq!(got[0].verdict_source.as_deref(), Some("producer"));
    let ignored = s
        .logged_runs(&LoggedFilter {
            labels: LabelUse::Ignore,
            ..all.clone()
        })
        .await
        .expect("ignore labels");
    assert_eq!(
        (ignored[5].success, ignored[5].verdict_source.clone()),
        (None, None)
    );

    // The second of June, whole: its two runs and the unjudged one that started just before midnight.
    let day = s
        .logged_runs(&LoggedFilter {
            since: Some("2025-06-02".into()),
            until: Some("2025-06-02".into()),
            ..all.clone()
        })
        .await
        .expect("one day");
    assert_eq!(ids(&day), vec![ts[1].id(), ts[2].id(), ts[5].id()]);
    let later = s
        .logged_runs(&LoggedFilter {
            since: Some("2025-06-03T12:00:00Z".into()),
            ..all.clone()
        })
        .await
        .expect("since a time");
    assert_eq!(ids(&later), vec![ts[4].id()]);
    // Runs that showed a tool: every run of the sample shows both, so a tool nobody showed gives none.
    let none = s
        .logged_runs(&LoggedFilter {
            tools: vec!["no_such_tool".into()],
            ..all.clone()
        })
        .await
        .expect("tool");
    assert!(none.is_empty());
    let shown = s
        .logged_runs(&LoggedFilter {
            tools: vec!["web_search".into(), "no_such_tool".into()],
            ..all.clone()
        })
        .await
        .expect("tool");
    assert_eq!(shown.len(), 6);
    // Verdicts of one source only.
    let judged = s
        .logged_runs(&LoggedFilter {
            verdict_sources: vec!["judge".into()],
            ..all.clone()
        })
        .await
        .expect("judge only");
    assert_eq!(ids(&judged), vec![ts[5].id()]);
    s.close().await;
}

#[tokio::test]
async fn sqlite_logged_runs_filter_by_time_tool_and_verdict_source() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Store::open(&dir.path().join("t.sqlite").display().to_string())
        .await
        .expect("open sqlite");
    logged_runs_filter_by_time_tool_and_verdict_source(s).await;
}

#[tokio::test]
async fn postgres_logged_runs_filter_by_time_tool_and_verdict_source() {
    use sqlx::Connection;
    let admin = std::env::var("TOOLTUNE_TEST_POSTGRES_URL").expect(
        "TOOLTUNE_TEST_POSTGRES_URL must name a PostgreSQL server: run the tests through scripts/test, which starts one",
    );
    let name = format!("tooltune_test_{}", uuid::Uuid::new_v4().simple());
    let mut c = sqlx::PgConnection::connect(&admin)
        .await
        .expect("connect to the test PostgreSQL");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut c)
        .await
        .expect("create test database");
    let (base, _) = admin.rsplit_once('/').expect("URL with a database path");
    let s = Store::open(&format!("{base}/{name}"))
        .await
        .expect("open postgres");
    logged_runs_filter_by_time_tool_and_verdict_source(s).await;
    // Best-effort: the cluster is a throwaway one, so a leftover database costs only disk.
    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&mut c)
        .await;
}

//! `tooltune optimize --from-traces`, the batch mode over logged runs, through the binary with the real fast local
//! model: the failing trajectories of a tool reach the reflector, the run is stored with its proposal, and the exit
//! code tells a cron job what happened.

use crate::tooltune;
use serde_json::Value;
use std::path::Path;

fn samples() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ingest/samples");
    ["tooltune", "openai", "langfuse", "otel"]
        .iter()
        .map(|f| dir.join(format!("{f}.jsonl")).display().to_string())
        .collect()
}

#[test]
fn from_traces_reflects_on_the_failing_logged_runs_and_exits_by_verdict() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("t.sqlite").display().to_string();
    let mut ingest = vec!["ingest"];
    let files = samples();
    ingest.extend(files.iter().map(String::as_str));
    let o = tooltune(&db, dir.path(), &ingest);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // A tool nobody logged: nothing to reflect on, exit code 2, and a stored run that says so.
    let o = tooltune(
        &db,
        dir.path(),
        &[
            "optimize",
            "--from-traces",
            "--tool",
            "no_such_tool",
            "--model",
            "local:fast",
            "--json",
        ],
    );
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["verdict"], "no_failures");
    assert_eq!(v["failing"], 0);

    // `read_file` failed in some logged runs: the reflector sees them and proposes (or fails to, which is a verdict
    // of its own); without a suite a proposal is never called an improvement.
    let o = tooltune(
        &db,
        dir.path(),
        &[
            "optimize",
            "--from-traces",
            "--tool",
            "read_file",
            "--max-examples",
            "2",
            "--model",
            "local:fast",
            "--json",
        ],
    );
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stderr)));
    assert_eq!(v["failing"], 2, "{v}");
    assert!(v["judged"].as_u64().unwrap_or(0) >= 2, "{v}");
    assert!(v["reflection_tokens"].as_u64().unwrap_or(0) > 0, "{v}");
    assert!(!v["seed_description"].as_str().unwrap_or("").is_empty());
    match v["verdict"].as_str() {
        Some("unvalidated") => {
            assert_eq!(o.status.code(), Some(0));
            assert!(!v["proposal"].as_str().unwrap_or("").is_empty(), "{v}");
        }
        Some("proposal_failed") => assert_eq!(o.status.code(), Some(3)),
        other => panic!("verdict {other:?} without a suite: {v}"),
    }
    assert!(v["validation"].is_null());

    // Both runs are in the store as `from-traces` runs with their results; the proposal is kept with the run.
    let runs = tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(async {
            let store = tooltune_store::Store::open(&db).await.expect("store");
            store.runs(10).await.expect("runs")
        });
    assert_eq!(runs.len(), 2);
    for r in &runs {
        assert_eq!(
            (r.kind.as_str(), r.status.as_str()),
            ("from-traces", "finished")
        );
        assert!(r.result.is_some());
    }
}

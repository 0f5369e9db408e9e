//! A run as a job of the server, with the server stopped in the middle and started again on the same store: the
//! restarted server lists the run, resumes it from its checkpoint without redoing or losing a finished rollout,
//! streams its events on from where a client left off (`Last-Event-ID`), and the run finishes with its report.
//! Real everything: the fast local model, the contractor MCP server, SQLite and the test PostgreSQL.

use crate::common;

use common::{SseReader, TestDb, TestServer};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tooltune_core::TrajectoryId;

/// Every stored rollout of the run's known candidates: (candidate, task, rollout) -> result.
async fn rollouts(t: &TestServer, id: &str) -> BTreeMap<(String, String, i64), String> {
    let detail = t.get_json(&format!("/api/runs/{id}")).await;
    let mut out = BTreeMap::new();
    for c in detail["progress"]["candidates"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        let descriptions: BTreeMap<String, String> =
            serde_json::from_value(c["descriptions"].clone()).expect("descriptions");
        let key = tooltune_driver::candidate_key(&descriptions);
        for r in t.store.rollouts(id, &key).await.expect("rollouts") {
            out.insert((key.clone(), r.task_id, r.rollout), r.result);
        }
    }
    out
}

async fn check_restart(db: &TestDb) {
    common::build_example_servers();
    let deadline = Instant::now() + Duration::from_secs(600);

    // First server: start the run and follow it until its seed has a validation score.
    let a = TestServer::start(db, common::config()).await;
    let id = a
        .start_run(json!({
            "suite": "contractor-small",
            "objective": "success",
            // The seed's validation (2 rollouts) and one minibatch rollout: the search then stops on its budget
            // and the driver compares seed and best on the test split.
            "budget": 3,
            "minibatch": 1,
            "seed": 7,
            "model": "local:fast",
        }))
        .await;
    let mut events = SseReader::open(&a, &format!("/api/runs/{id}/events"), None).await;
    let mut last_id = None;
    let mut seqs = Vec::new();
    while let Some(e) = events.next(deadline).await {
        assert_eq!(e.event, "progress", "{e:?}");
        last_id = e.id.clone();
        seqs.push(e.id.clone().expect("event id"));
        if e.json()["event"] == "evaluated" {
            break;
        }
    }
    let last_id = last_id.expect("events before the restart");
    drop(events);
    // The `evaluated` event is emitted before the step's checkpoint is written; stopping at once raced with that
    // write. Wait for the checkpoint, so the restart really is mid-run with one.
    while a
        .store
        .run(&id)
        .await
        .expect("run")
        .is_none_or(|r| r.state.is_none())
    {
        assert!(Instant::now() < deadline, "no checkpoint was written");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.stop().await;

    // The run is left `running` with its checkpoint, as after a crash.
    let b = TestServer::start(db, common::config()).await;
    let row = b.store.run(&id).await.expect("run").expect("the run");
    assert!(row.state.is_some(), "no checkpoint before the restart");
    let before = rollouts(&b, &id).await;
    assert!(!before.is_empty(), "no rollout finished before the restart");

    // The second server lists it and drives it.
    let runs = b.get_json("/api/runs").await;
    let listed = &runs["runs"][0];
    assert_eq!(listed["id"], id.as_str());
    assert_eq!(listed["in_this_server"], true, "{listed}");
    assert!(
        listed["status"] == "running" || listed["status"] == "queued",
        "{listed}"
    );

    // A client that reconnects with the last id it saw gets the rest, in order, without repeats.
    let mut events = SseReader::open(&b, &format!("/api/runs/{id}/events"), Some(&last_id)).await;
    let mut next_seq: i64 = last_id.parse::<i64>().expect("numeric id") + 1;
    let mut resumed = false;
    let mut end: Option<Value> = None;
    while let Some(e) = events.next(deadline).await {
        if e.event == "end" {
            end = Some(e.json());
            continue;
        }
        assert_eq!(e.event, "progress", "{e:?}");
        assert_eq!(
            e.id.as_deref().map(|s| s.parse::<i64>().expect("id")),
            Some(next_seq),
            "events out of order or repeated"
        );
        next_seq += 1;
        let v = e.json();
        if v["event"] == "started" {
            assert_eq!(v["resumed"], true, "{v}");
            resumed = true;
        }
    }
    assert!(resumed, "the restarted server did not resume the run");
    let end = end.expect("an end event");
    assert_eq!(end["status"], "finished", "{end}");

    // Nothing finished before the restart was redone or lost.
    let after = rollouts(&b, &id).await;
    for (k, v) in &before {
        assert_eq!(after.get(k), Some(v), "rollout {k:?} lost or changed");
    }
    let mut seen = BTreeMap::new();
    for tid in b.store.trajectory_ids(None, 10_000).await.expect("ids") {
        let t = b
            .store
            .trajectory(&TrajectoryId::from_stored(tid.as_str().to_string()))
            .await
            .expect("load")
            .expect("stored");
        if t.links.run_id.as_deref() == Some(id.as_str()) {
            *seen
                .entry((t.links.candidate_id, t.meta.external_id, t.links.rollout))
                .or_insert(0) += 1;
        }
    }
    assert!(!seen.is_empty());
    assert!(
        seen.values().all(|n| *n == 1),
        "a rollout was run twice: {seen:?}"
    );

    // The finished run: its summary through the API, its page with charts and lineage, its report.
    let detail = b.get_json(&format!("/api/runs/{id}")).await;
    assert_eq!(detail["run"]["status"], "finished");
    assert!(detail["result"]["test"]["seed"]["success"]["trials"].as_u64() > Some(0));
    assert!(
        detail["evaluations"]
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e["phase"] == "validation"))
    );
    let page = b.get_text(&format!("/runs/{id}")).await;
    assert!(page.contains("id=\"chart-success\"") && page.contains("<svg"));
    assert!(page.contains("class=\"tree\""));
    let report = b.get_text(&format!("/runs/{id}/report")).await;
    assert!(report.contains(&id));
    let figures = b.get_json(&format!("/api/report?runs={id}")).await;
    assert!(figures["runs"].as_array().is_some_and(|r| r.len() == 1));
    // A replay of the whole stream from the start ends at once with the same events.
    let mut replay = SseReader::open(&b, &format!("/api/runs/{id}/events"), None).await;
    let mut n = 0;
    while let Some(e) = replay.next(deadline).await {
        if e.event == "progress" {
            n += 1;
        }
    }
    assert_eq!(
        n as i64, next_seq,
        "the replay differs from the live stream"
    );
    assert!(seqs.len() <= n);
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_run_resumes_after_restart() {
    let db = TestDb::sqlite();
    check_restart(&db).await;
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_run_resumes_after_restart() {
    let db = TestDb::postgres().await;
    check_restart(&db).await;
    db.finish().await;
}

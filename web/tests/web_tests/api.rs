//! The JSON API against the real server on a loopback port 0, over a SQLite file and over the PostgreSQL that
//! `scripts/test` starts: ingest (every format, idempotence, all-or-nothing with the bad record named, size limit),
//! tool statistics, authentication and the `Host`/`Origin` rules, run requests that must be refused, a run that
//! fails at once (its job, status and event stream), escaping of untrusted text and secrets never shown.
//! The model-driven run with a restart in the middle is in `run_restart.rs`.

use crate::common;

use common::{SseReader, TOKEN, TestDb, TestServer};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tooltune_web::{ServeConfig, Server, Token};

const SAMPLES: [(&str, usize); 4] = [
    ("tooltune", 16),
    ("openai", 16),
    ("langfuse", 16),
    ("otel", 16),
];

fn sample(format: &str) -> String {
    std::fs::read_to_string(common::workspace().join(format!("ingest/samples/{format}.jsonl")))
        .expect("sample file")
}

/// A suite whose server cannot start: a run on it fails at once, without a model ever being asked anything.
const BROKEN_SUITE: &str = r#"
name = "broken"
tools_under_study = ["search_docs"]
[server]
command = "${SUITE_DIR}/no-such-server"
[[task]]
id = "t1"
prompt = "Anything."
split = "train"
owner = "search_docs"
expect_tools = ["search_docs"]
[[task]]
id = "t2"
prompt = "Anything else."
split = "validation"
owner = "search_docs"
expect_tools = ["search_docs"]
[[task]]
id = "t3"
prompt = "And more."
split = "test"
owner = "search_docs"
expect_tools = ["search_docs"]
"#;

/// A model spec with a password in its base URL: it must never be shown. Nothing is ever sent to it (the runs
/// using it fail before the model is asked anything) and the port is the discard port on loopback.
const SECRET_MODEL: &str = "openai:test-model@http://user:hunter2-not-shown@127.0.0.1:9/v1";

async fn check_api(db: &TestDb) {
    let suites = tempfile::tempdir().expect("tempdir");
    std::fs::write(suites.path().join("broken.toml"), BROKEN_SUITE).expect("suite");
    let mut cfg = common::config();
    cfg.suites_dir = suites.path().to_path_buf();
    cfg.models = vec![SECRET_MODEL.into()];
    cfg.api_key_env = Some("TOOLTUNE_WEB_TEST_UNSET_KEY".into());
    cfg.max_trace_bytes = 256 << 10;
    let t = TestServer::start(db, cfg).await;

    let health = t.get_json("/api/health").await;
    assert_eq!(health["ok"], true);
    assert_eq!(health["auth"], true);

    check_auth(&t).await;
    check_ingest(&t).await;
    check_bad_input(&t).await;
    check_runs_refused(&t).await;
    check_failing_run(&t).await;
    check_escaping(&t).await;
    check_no_secret_shown(&t).await;
    check_run_of_another_process(t).await;
}

/// A run that another process drives (the CLI's `optimize` on the same store): its events reach an open stream as
/// they are stored, it cannot be stopped from here, and an open stream does not hold up the server's shutdown.
async fn check_run_of_another_process(t: TestServer) {
    let id = "run-elsewhere0";
    t.store
        .create_run(
            id,
            tooltune_store::RunKind::Optimize,
            Some("elsewhere.toml"),
            tooltune_objectives::Objective::TaskSuccess,
            "{}",
        )
        .await
        .expect("create run");
    t.store
        .push_event(
            id,
            &json!({ "event": "started", "run_id": id, "objective": "success", "resumed": false })
                .to_string(),
        )
        .await
        .expect("event");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut events = SseReader::open(&t, &format!("/api/runs/{id}/events"), None).await;
    let first = events.next(deadline).await.expect("first event");
    assert_eq!(first.id.as_deref(), Some("0"));
    assert_eq!(first.json()["event"], "started");
    t.store
        .push_event(
            id,
            &json!({ "event": "stopped", "reason": "Budget" }).to_string(),
        )
        .await
        .expect("event");
    let second = events.next(deadline).await.expect("second event");
    assert_eq!(second.id.as_deref(), Some("1"));
    assert_eq!(second.json()["reason"], "Budget");
    let listed = t.get_json("/api/runs").await;
    let run = listed["runs"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["id"] == id))
        .cloned()
        .expect("listed");
    assert_eq!(run["status"], "running");
    assert_eq!(run["in_this_server"], false);
    let r = t
        .post(&format!("/api/runs/{id}/stop"))
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert_eq!(t.get(&format!("/runs/{id}")).await.status(), StatusCode::OK);
    tokio::time::timeout(Duration::from_secs(15), t.stop())
        .await
        .expect("an open event stream held up the shutdown");
    assert!(
        events.next(deadline).await.is_none(),
        "the stream outlived the server"
    );
}

async fn check_auth(t: &TestServer) {
    let body = sample("tooltune");
    // No token, a wrong token: 401 with a challenge, and nothing stored.
    let r = t
        .client
        .post(t.url("/api/traces"))
        .body(body.clone())
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        r.headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok()),
        Some("Bearer")
    );
    let r = t
        .client
        .post(t.url("/api/traces"))
        .header("Authorization", "Bearer not-the-token-at-all")
        .body(body.clone())
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = t
        .client
        .post(t.url("/api/runs/run-x/stop"))
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(t.store.count_trajectories().await.expect("count"), 0);

    // A write from another site's page is refused even with the token.
    let r = t
        .post("/api/traces")
        .header("Origin", "http://evil.example")
        .body(body.clone())
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // A loopback server answers loopback names only (DNS rebinding).
    let r = t
        .client
        .get(t.url("/api/tools"))
        .header("Host", "evil.example")
        .send()
        .await
        .expect("GET");
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // Reads need no token; responses carry the security headers.
    let r = t.get("/").await;
    assert_eq!(r.status(), StatusCode::OK);
    let csp = r
        .headers()
        .get("content-security-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    assert!(csp.contains("script-src 'self'"), "{csp}");
    assert_eq!(
        r.headers()
            .get("x-content-type-options")
            .and_then(|v| v.to_str().ok()),
        Some("nosniff")
    );

    // The server refuses to listen publicly without a token, and refuses a short token.
    let public = ServeConfig::new("0.0.0.0:0".parse().expect("addr"));
    let dir = tempfile::tempdir().expect("tempdir");
    let store = tooltune_store::Store::open(&dir.path().join("x.sqlite").display().to_string())
        .await
        .expect("store");
    match Server::start(store, public).await {
        Err(e) => assert!(e.to_string().contains("TOOLTUNE_TOKEN"), "{e}"),
        Ok(_) => panic!("a public address without a token was accepted"),
    }
    assert!(Token::new("short".into()).is_err());
}

async fn check_ingest(t: &TestServer) {
    let mut total = 0;
    for (format, records) in SAMPLES {
        let r = t
            .post("/api/traces")
            .header("Content-Type", "application/x-ndjson")
            .body(sample(format))
            .send()
            .await
            .expect("POST traces");
        assert_eq!(r.status(), StatusCode::OK, "{format}");
        let v: Value = r.json().await.expect("JSON");
        assert_eq!(v["format"], format, "{v}");
        assert_eq!(v["added"], records, "{format}: {v}");
        total += records;
    }
    assert_eq!(
        t.store.count_trajectories().await.expect("count"),
        total as u64
    );
    // The same body again adds nothing: ids are content addresses.
    let r = t
        .post("/api/traces?format=tooltune")
        .body(sample("tooltune"))
        .send()
        .await
        .expect("POST");
    let v: Value = r.json().await.expect("JSON");
    assert_eq!(v["added"], 0, "{v}");
    assert_eq!(v["already_present"], 16, "{v}");

    // `GET /api/tools` is what `tooltune traces stats --json` prints: the store's statistics, unchanged, with
    // tooltune's labels counted where the producer wrote no outcome unless `labels=ignore`.
    let trajectories = t.store.count_trajectories().await.expect("count");
    for (query, labels) in [
        ("", tooltune_store::LabelUse::Use),
        ("?labels=use", tooltune_store::LabelUse::Use),
        ("?labels=ignore", tooltune_store::LabelUse::Ignore),
    ] {
        let api = t.get_json(&format!("/api/tools{query}")).await;
        let direct = json!({
            "trajectories": trajectories,
            "labels": labels,
            "tools": t.store.tool_stats_with(None, labels).await.expect("stats"),
        });
        assert!(same_json(&api, &direct), "{query}: {api}\n!=\n{direct}");
    }
    assert_eq!(t.get("/api/tools?labels=sometimes").await.status(), 400);
    let one = t.get_json("/api/tools?tool=calculator").await;
    assert!(
        one["tools"]
            .as_array()
            .is_some_and(|a| !a.is_empty() && a.iter().all(|s| s["tool"] == "calculator")),
        "{one}"
    );

    // A stored trajectory by id, and one that is not there.
    let id = t
        .store
        .trajectory_ids(None, 1)
        .await
        .expect("ids")
        .remove(0);
    let v = t
        .get_json(&format!("/api/trajectories/{}", id.as_str()))
        .await;
    assert!(v["trajectory"]["task"].is_string(), "{v}");
    assert_eq!(
        t.get("/api/trajectories/0000").await.status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(t.get("/api/nothing").await.status(), StatusCode::NOT_FOUND);

    // Pages over the data: the tools on the home page, a tool's versions, a trajectory.
    let home = t.get_text("/").await;
    assert!(home.contains("href=\"/tools/calculator\""), "{home}");
    let tool = t.get_text("/tools/calculator").await;
    assert!(tool.contains("Description versions"));
    assert!(tool.contains("href=\"/trajectories/"));
    let page = t.get_text(&format!("/trajectories/{}", id.as_str())).await;
    assert!(page.contains("Steps") && page.contains("Final answer"));
    assert_eq!(
        t.get("/tools/no-such-tool").await.status(),
        StatusCode::NOT_FOUND
    );
}

/// Equal JSON, numbers within 1e-12 (serde_json's default float parsing is not exact to the last bit).
fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => (x - y).abs() <= 1e-12,
            _ => x == y,
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same_json(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

async fn check_bad_input(t: &TestServer) {
    let before = t.get_json("/api/tools").await;
    let good = sample("tooltune");
    let mut lines = good.lines().filter(|l| !l.trim().is_empty());
    let (a, b, c) = (
        lines.next().expect("line"),
        lines.next().expect("line"),
        lines.next().expect("line"),
    );
    // A fresh record first (so that a partial store would show), then a broken one on line 3.
    let fresh = a.replace("notes.txt", "notes-v2.txt");
    let body = format!("{fresh}\n{b}\n{}\n{c}\n", &c[..c.len() / 2]);
    let r = t
        .post("/api/traces")
        .body(body.clone())
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let v: Value = r.json().await.expect("JSON");
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("nothing of this request was stored")),
        "{v}"
    );
    let records = v["records"].as_array().expect("records");
    assert_eq!(records.len(), 1, "{v}");
    assert_eq!(records[0]["line"], 3, "{v}");
    assert!(records[0]["message"].is_string());
    assert!(
        same_json(&t.get_json("/api/tools").await, &before),
        "a rejected request changed the store"
    );

    // With skip_invalid the good records are stored and the bad one is listed.
    let r = t
        .post("/api/traces?skip_invalid=true")
        .body(body)
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status(), StatusCode::OK);
    let v: Value = r.json().await.expect("JSON");
    assert_eq!(v["added"], 1, "{v}");
    assert_eq!(v["skipped"][0]["line"], 3, "{v}");

    // An unknown format, an undetectable one, an empty body, an unknown query parameter: 400.
    for (path, body) in [
        ("/api/traces?format=xml", good.clone()),
        ("/api/traces", "{\"hello\": 1}\n".to_string()),
        ("/api/traces", "\n\n".to_string()),
        ("/api/traces?frmat=otel", good.clone()),
    ] {
        let r = t.post(path).body(body).send().await.expect("POST");
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{path}");
        let v: Value = r.json().await.expect("JSON");
        assert!(v["error"].is_string(), "{v}");
    }

    // Over the size limit (256 KiB in these tests): 413 and nothing stored.
    let count = t.store.count_trajectories().await.expect("count");
    let mut big = String::new();
    while big.len() <= 256 << 10 {
        big.push_str(&good);
    }
    let r = t.post("/api/traces").body(big).send().await.expect("POST");
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(t.store.count_trajectories().await.expect("count"), count);
    // JSON endpoints have their own, smaller limit.
    let huge = json!({ "suite": "broken", "tools": vec!["x".repeat(1000); 100] });
    let r = t.post("/api/runs").json(&huge).send().await.expect("POST");
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
}

async fn check_runs_refused(t: &TestServer) {
    for (body, why) in [
        (json!({ "suite": "../etc/passwd" }), "a path"),
        (json!({ "suite": "no-such-suite" }), "an unknown suite"),
        (
            json!({ "suite": "broken", "model": "openai:x@http://127.0.0.1:9/v1" }),
            "a model the operator did not allow",
        ),
        (json!({ "suite": "broken", "budget": 0 }), "no budget"),
        (
            json!({ "suite": "broken", "objective": "fame" }),
            "an unknown objective",
        ),
        (
            json!({ "suite": "broken", "colour": "red" }),
            "an unknown field",
        ),
    ] {
        let r = t.post("/api/runs").json(&body).send().await.expect("POST");
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{why}");
        let v: Value = r.json().await.expect("JSON");
        assert!(v["error"].is_string(), "{why}: {v}");
    }
    assert_eq!(t.get_json("/api/runs").await["runs"], json!([]));
    assert_eq!(
        t.get("/api/runs/run-nope").await.status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        t.get("/runs/run-nope").await.status(),
        StatusCode::NOT_FOUND
    );
    let r = t
        .post("/api/runs/run-nope/stop")
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    // The suites runs may use, and the models, with the password hidden.
    let s = t.get_json("/api/suites").await;
    assert_eq!(s["suites"][0]["name"], "broken", "{s}");
    assert_eq!(
        s["models"][0],
        "openai:test-model@http://user:***@127.0.0.1:9/v1"
    );
}

async fn check_failing_run(t: &TestServer) {
    let id = t
        .start_run(json!({ "suite": "broken", "budget": 5, "seed": 3 }))
        .await;
    // The event stream of a run ends with its final status.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut events = SseReader::open(t, &format!("/api/runs/{id}/events"), None).await;
    let mut end = None;
    while let Some(e) = events.next(deadline).await {
        if e.event == "end" {
            end = Some(e.json());
        }
    }
    let end = end.expect("an end event");
    assert_eq!(end["status"], "failed", "{end}");
    assert!(
        end["error"]
            .as_str()
            .is_some_and(|e| e.contains("no-such-server")),
        "{end}"
    );
    let runs = t.get_json("/api/runs").await;
    assert_eq!(runs["runs"][0]["id"], id.as_str());
    assert_eq!(runs["runs"][0]["status"], "failed");
    assert_eq!(runs["runs"][0]["in_this_server"], false);
    let detail = t.get_json(&format!("/api/runs/{id}")).await;
    assert_eq!(detail["run"]["status"], "failed");
    assert_eq!(detail["config"]["objective"], "success");
    assert_eq!(detail["links"]["events"], format!("/api/runs/{id}/events"));
    // A finished run cannot be stopped here.
    let r = t
        .post(&format!("/api/runs/{id}/stop"))
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status(), StatusCode::CONFLICT);
    // Its page shows the error.
    let page = t.get_text(&format!("/runs/{id}")).await;
    assert!(page.contains("no-such-server"), "{page}");
}

async fn check_escaping(t: &TestServer) {
    let script = "<script>alert('x')</script>";
    let record = json!({
        "task": format!("Find {script} in the docs"),
        "tools": [{ "name": "search_docs", "description": format!("Search. {script} The best tool ever."),
                    "input_schema": { "type": "object", "properties": { "query": { "type": "string" } } } }],
        "steps": [
            { "type": "model", "tool_calls": [{ "id": "c1", "name": "search_docs", "arguments": { "query": script } }] },
            { "type": "tool_result", "call_id": "c1", "name": "search_docs", "content": format!("found {script}") },
            { "type": "model", "content": format!("Answer: {script}") }
        ],
        "final_answer": format!("Answer: {script}"),
        "outcome": { "success": true, "feedback": script },
    });
    let r = t
        .post("/api/traces")
        .body(format!("{record}\n"))
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status(), StatusCode::OK, "{:?}", r.text().await);
    let ids = t
        .store
        .trajectory_ids(Some("search_docs"), 10)
        .await
        .expect("ids");
    let mut pages = vec!["/".to_string(), "/tools/search_docs".to_string()];
    pages.extend(ids.iter().map(|i| format!("/trajectories/{}", i.as_str())));
    for p in pages {
        let html = t.get_text(&p).await;
        assert!(!html.contains("<script>alert"), "{p} renders a script");
        if p != "/" {
            assert!(html.contains("&lt;script&gt;"), "{p} lost the text");
        }
    }
}

async fn check_no_secret_shown(t: &TestServer) {
    let runs = t.get_json("/api/runs").await;
    let id = runs["runs"][0]["id"].as_str().expect("id").to_string();
    for p in [
        "/".to_string(),
        "/api/runs".to_string(),
        format!("/api/runs/{id}"),
        format!("/runs/{id}"),
        format!("/runs/{id}/live"),
        "/api/suites".to_string(),
        "/api/health".to_string(),
    ] {
        let body = t.get_text(&p).await;
        assert!(!body.contains("hunter2"), "{p} shows a password");
        assert!(!body.contains(TOKEN), "{p} shows the token");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_api() {
    let db = TestDb::sqlite();
    check_api(&db).await;
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_api() {
    let db = TestDb::postgres().await;
    check_api(&db).await;
    db.finish().await;
}

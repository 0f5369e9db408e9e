//! The dashboard in headless Chromium, as a person would use it: open the home page, ingest traces through the
//! API and see the tools appear, start a short run (contractor-small, the fast local model, a small budget), watch
//! its progress events arrive on the run page, see the score charts and the lineage render, stop it with the
//! page's button, and see the run end. Screenshots go to `target/artefacts/` for CI to keep.
//!
//! The server runs without a token on loopback (the default for a local dashboard), so the page's stop button
//! works as a visitor's would.

use crate::common;

use common::cdp::Browser;
use common::{TestDb, TestServer};
use reqwest::StatusCode;
use serde_json::json;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_follows_a_live_run() {
    let started = Instant::now();
    common::build_example_servers();
    let db = TestDb::sqlite();
    let mut cfg = common::config();
    cfg.token = None;
    let t = TestServer::start(&db, cfg).await;
    let artefacts = common::artefacts_dir();
    let mut b = Browser::launch().await;

    // The home page of an empty store says so.
    b.goto(&t.url("/")).await;
    assert_eq!(
        b.eval("document.querySelectorAll('#tools tbody tr').length")
            .await,
        json!(0)
    );
    assert!(
        b.eval("document.body.innerText")
            .await
            .as_str()
            .is_some_and(|s| s.contains("No traces yet")),
        "the empty home page"
    );

    // Traces in every format through the API; the reloaded page lists their tools.
    for format in ["tooltune", "openai", "langfuse", "otel"] {
        let body = std::fs::read_to_string(
            common::workspace().join(format!("ingest/samples/{format}.jsonl")),
        )
        .expect("sample");
        let r = t.post("/api/traces").body(body).send().await.expect("POST");
        assert_eq!(r.status(), StatusCode::OK, "{format}");
    }
    b.goto(&t.url("/")).await;
    let rows = b
        .eval("document.querySelectorAll('#tools tbody tr').length")
        .await;
    assert!(rows.as_u64().is_some_and(|n| n >= 4), "tool rows: {rows}");
    b.screenshot(&artefacts.join("web-home.png")).await;

    // A short run, and its page opened at once.
    let id = t
        .start_run(json!({
            "suite": "contractor-small",
            "objective": "success",
            "budget": 12,
            "seed": 7,
            // Minibatches of one task: a reflection comes after three rollouts instead of five.
            "minibatch": 1,
            "model": "local:fast",
        }))
        .await;
    b.goto(&t.url(&format!("/runs/{id}"))).await;
    // Generous: two cores shared with other work make a rollout of the local model take from seconds to a minute.
    let live = Duration::from_secs(480);
    // Progress events arrive while the run goes on: first the start, then a validation evaluation, which the
    // page draws in its charts and its lineage.
    b.wait_for("Number(document.body.dataset.eventsReceived) >= 1", live)
        .await;
    b.wait_for("document.querySelector('#event-log .ev-evaluated')", live)
        .await;
    b.wait_for(
        "document.querySelectorAll('#chart-success svg circle').length >= 1 && \
         document.querySelectorAll('#chart-selection svg circle').length >= 1",
        Duration::from_secs(30),
    )
    .await;
    b.wait_for(
        "document.querySelectorAll('#lineage li.node').length >= 1",
        Duration::from_secs(30),
    )
    .await;
    let events_then = b.eval("Number(document.body.dataset.eventsReceived)").await;
    // A reflection proposes a child of the seed: the lineage grows a branch (unless the run ends first).
    b.wait_for(
        "document.querySelector('#event-log .ev-proposed.ok') || document.body.dataset.ended",
        live,
    )
    .await;
    b.wait_for(
        "document.querySelectorAll('#lineage li.node li.node').length >= 1 || document.body.dataset.ended",
        live,
    )
    .await;
    let events_now = b.eval("Number(document.body.dataset.eventsReceived)").await;
    assert!(
        events_now.as_u64() > events_then.as_u64(),
        "no events arrived while the page was open ({events_then} then {events_now})"
    );
    b.screenshot(&artefacts.join("web-run-live.png")).await;

    // The visitor stops the run with the page's button; it ends after its current step and the test split.
    if b.eval("document.body.dataset.ended || ''").await == json!("") {
        b.eval("document.getElementById('stop').click()").await;
        // The button confirms once the server accepted the stop.
        b.wait_for(
            "document.getElementById('stop').disabled || document.body.dataset.ended",
            Duration::from_secs(30),
        )
        .await;
    }
    b.wait_for("document.body.dataset.ended", live).await;
    let ended = b.eval("document.body.dataset.ended").await;
    assert!(
        ended == json!("stopped") || ended == json!("finished"),
        "the run ended as {ended}"
    );
    // The live part was refreshed after the end: the status, the charts and the lineage are there.
    b.wait_for(
        &format!(
            "document.getElementById('run-status') && document.getElementById('run-status').textContent.trim() === {ended}"
        ),
        Duration::from_secs(30),
    )
    .await;
    let nodes = b
        .eval("document.querySelectorAll('#lineage li.node').length")
        .await;
    assert!(nodes.as_u64().is_some_and(|n| n >= 1), "lineage: {nodes}");
    assert!(
        b.eval("document.querySelectorAll('#chart-success svg circle').length")
            .await
            .as_u64()
            .is_some_and(|n| n >= 1)
    );
    assert!(
        b.eval("document.querySelector('#test table') !== null")
            .await
            == json!(true),
        "the seed-against-winner table after the end"
    );
    // Untrusted text never became markup: no script element but ours.
    assert_eq!(
        b.eval("document.querySelectorAll('script').length").await,
        json!(1)
    );
    b.screenshot(&artefacts.join("web-run-page.png")).await;

    // A trajectory of the run, reached from its candidate's rollouts.
    let href = b
        .eval(
            "(document.querySelector('#candidates a[href^=\"/trajectories/\"]') || {}).href || ''",
        )
        .await;
    let href = href.as_str().unwrap_or("").to_string();
    assert!(!href.is_empty(), "no rollout links on the run page");
    b.goto(&href).await;
    assert!(
        b.eval("document.querySelectorAll('ol.steps li.step').length")
            .await
            .as_u64()
            .is_some_and(|n| n >= 1)
    );
    b.screenshot(&artefacts.join("web-trajectory.png")).await;

    b.close().await;
    t.stop().await;
    db.finish().await;
    eprintln!(
        "browser test took {:.0} s; screenshots in {}",
        started.elapsed().as_secs_f64(),
        artefacts.display()
    );
}

//! The driver's side of the job queue when its own link to PostgreSQL goes silent (packets dropped, no reset), as
//! the driver of a run on workers meets it: the wait for results rides the silence out and returns what the
//! workers wrote meanwhile, and a stop asked during the silence ends the wait instead of hanging on the link. (The
//! workers' side of the same fault is in `optimize_cli`, with whole runs.)

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tooltune_evaluator::evaluate::Mode;
use tooltune_store::{JobResult, JobSuite, Store};
use tooltune_worker::{Dispatcher, Job, WorkerError, WorkerPolicy, queue_name};

use crate::postgres::{Relay, drop_postgres, fresh_postgres};

/// How long the dispatcher lets one call to the store take (its `CALL_LIMIT`): a silent link is noticed after it.
const CALL_LIMIT: Duration = Duration::from_secs(20);

fn job(key: &str, suite: &str, model: &str) -> Job {
    Job {
        key: key.into(),
        suite: suite.into(),
        model: model.into(),
        task_id: "t".into(),
        mode: Mode::SelectionOnly,
        descriptions: Default::default(),
        target: "search_docs".into(),
        rollout: 0,
        seed: None,
        run_id: None,
        candidate_id: None,
        max_attempts: 3,
        call_timeout_ms: 1000,
    }
}

/// A result as a worker writes it, straight to the server (the workers' link is not the one that failed).
async fn write_result(direct: &Store, queue: &str, key: &str) {
    let written = direct
        .put_job_result(&JobResult {
            key: key.into(),
            queue: queue.into(),
            result: format!("{{\"task_id\":\"{key}\"}}"),
            trajectory: None,
            infra: false,
            worker: "test-worker".into(),
            attempts: 1,
            model_ms: 1.0,
            queue_ms: 0.1,
        })
        .await
        .expect("write a job result");
    assert!(written, "result {key} written once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_whose_store_goes_silent_waits_it_out_for_the_results_and_a_stop_during_the_silence_ends_the_wait()
 {
    let (db, admin, name) = fresh_postgres().await;
    let relay = Relay::start(&db).await;
    // The driver reaches the store through the relay; the "workers" (this test) write to the server directly.
    let through = Store::open(&relay.url).await.expect("open through relay");
    let direct = Store::open(&db).await.expect("open directly");
    let suite = JobSuite {
        digest: format!("{:064x}", std::process::id()),
        name: "silent-store".into(),
        text: String::new(),
        origin: "workers_cli".into(),
        fixture_digest: String::new(),
    };
    // A model no worker has, so the jobs stay queued and only this test answers them.
    let dispatcher = Dispatcher::open(
        &through,
        "test-model-no-worker-has",
        "",
        &suite,
        WorkerPolicy::default(),
    )
    .await
    .expect("open the queue");
    let queue = queue_name(dispatcher.model(), &suite.digest);
    let model = dispatcher.model().to_string();

    // 1. A wait that the silence falls into: one result is there before, two come while the link is frozen.
    write_result(&direct, &queue, "k1").await;
    let jobs: Vec<Job> = ["k1", "k2", "k3"]
        .iter()
        .map(|k| job(k, &suite.digest, &model))
        .collect();
    let waiting = {
        let (d, jobs) = (dispatcher.clone(), jobs.clone());
        tokio::spawn(async move { d.run(&jobs, &|| false).await })
    };
    // The jobs are sent and the driver polls; then its link goes silent.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !waiting.is_finished(),
        "the wait ended with two results missing"
    );
    relay.freeze();
    // The relay notices a freeze within 20 ms; a poll already on the wire before then may still pass, so the
    // results come only once every link through it is held.
    tokio::time::sleep(Duration::from_secs(1)).await;
    write_result(&direct, &queue, "k2").await;
    write_result(&direct, &queue, "k3").await;
    // Past the call limit, the stuck poll has timed out and the driver waits on through the silence.
    tokio::time::sleep(CALL_LIMIT + Duration::from_secs(3)).await;
    if waiting.is_finished() {
        panic!(
            "the wait ended while the store was silent: {:?}",
            waiting.await
        );
    }
    relay.restore();
    let results = tokio::time::timeout(CALL_LIMIT + Duration::from_secs(10), waiting)
        .await
        .expect("the wait ends once the store answers again")
        .expect("wait task")
        .expect("the results written during the silence, not an error");
    let keys: Vec<&str> = results.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["k1", "k2", "k3"], "every result, in job order");

    // 2. A stop asked while the link is silent ends the wait (before, a poll stuck on the link never returned,
    //    and the stop, asked between polls, was never heard).
    let stop = Arc::new(AtomicBool::new(false));
    let waiting = {
        let (d, stop) = (dispatcher.clone(), stop.clone());
        let jobs = vec![job("k4", &suite.digest, &model)];
        tokio::spawn(async move { d.run(&jobs, &|| stop.load(Ordering::SeqCst)).await })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    relay.freeze();
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::SeqCst);
    let asked = Instant::now();
    let ended = tokio::time::timeout(CALL_LIMIT + Duration::from_secs(10), waiting)
        .await
        .expect("a stop during the silence ends the wait within the call limit")
        .expect("wait task");
    assert!(
        matches!(ended, Err(WorkerError::Interrupted { waiting: 1, .. })),
        "{ended:?}"
    );
    assert!(
        asked.elapsed() <= CALL_LIMIT + Duration::from_secs(5),
        "the stop took {:?}",
        asked.elapsed()
    );
    relay.restore();
    drop(through);
    drop_postgres(&admin, &name).await;
}

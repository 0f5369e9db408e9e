//! What rollout jobs need beside their queue (issue 30, `tooltune worker`): suites by content address, which
//! queue serves which model and suite, job results written once under their content address, and the workers'
//! own reports. The queue itself is pgmq's, driven by `tooltune-worker`; like every other body here, results and
//! trajectories are JSON text whose shape the store does not know.

use crate::runs::now;
use crate::{Store, StoreError, q};
use sqlx::Row;
use std::collections::HashMap;

/// How many keys one batched lookup binds at most.
const LOOKUP_CHUNK: usize = 500;

/// A suite file kept by content address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSuite {
    /// sha256 hex of the file.
    pub digest: String,
    /// The suite's name.
    pub name: String,
    /// The file's text.
    pub text: String,
    /// Where the driver read it (a hint for a worker on the same machine).
    pub origin: String,
    /// The fixture's content address, `""` without a fixture.
    pub fixture_digest: String,
}

/// A queue and what it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobQueue {
    /// The pgmq queue's name.
    pub queue: String,
    /// The agent model's identity.
    pub model: String,
    /// The suite's content address.
    pub suite_digest: String,
}

/// A job's result as a worker wrote it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobResult {
    /// The job's content address (its rollout or screen key).
    pub key: String,
    /// The queue it came from.
    pub queue: String,
    /// JSON: the evaluator's per-task result.
    pub result: String,
    /// JSON: the rollout's trajectory, when it has one.
    pub trajectory: Option<String>,
    /// Whether the worker gave up on the job (an infrastructure failure).
    pub infra: bool,
    /// The worker that wrote it.
    pub worker: String,
    /// How many times the job had been taken.
    pub attempts: i64,
    /// The job's share of its batch's evaluation time.
    pub model_ms: f64,
    /// The job's share of the worker's queue operations.
    pub queue_ms: f64,
}

/// A worker as it last reported itself.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WorkerRow {
    /// Host, pid and a random suffix.
    pub id: String,
    /// The machine.
    pub host: String,
    /// The agent model identity it serves.
    pub model: String,
    /// When it started (RFC 3339).
    pub started_at: String,
    /// Its last report (RFC 3339).
    pub last_seen: String,
    /// Jobs whose results it wrote.
    pub jobs_done: i64,
    /// Jobs it could not finish (an infrastructure failure, a suite it could not serve).
    pub failures: i64,
    /// idle, busy or stopped.
    pub state: String,
}

/// `$from, $from+1, ...`: `n` bind placeholders for an `IN (...)` list.
pub(crate) fn placeholders(from: usize, n: usize) -> String {
    (from..from + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Store {
    /// Keeps a suite file under its digest (a suite already kept is left as it is: the digest is its content).
    pub async fn save_job_suite(&self, s: &JobSuite) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO job_suites (digest, name, text, origin, fixture_digest, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
        )
        .bind(&s.digest)
        .bind(&s.name)
        .bind(&s.text)
        .bind(&s.origin)
        .bind(&s.fixture_digest)
        .bind(now())
        .execute(self.pool())
        .await
        .map_err(q("keeping a job suite"))?;
        Ok(())
    }

    /// The suite kept under `digest`.
    pub async fn job_suite(&self, digest: &str) -> Result<Option<JobSuite>, StoreError> {
        let row = sqlx::query(
            "SELECT digest, name, text, origin, fixture_digest FROM job_suites WHERE digest = $1",
        )
        .bind(digest)
        .fetch_optional(self.pool())
        .await
        .map_err(q("reading a job suite"))?;
        Ok(row.map(|r| JobSuite {
            digest: r.get(0),
            name: r.get(1),
            text: r.get(2),
            origin: r.get(3),
            fixture_digest: r.get(4),
        }))
    }

    /// Records which model and suite a queue serves (idempotent).
    pub async fn register_job_queue(&self, queue: &JobQueue) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO job_queues (queue, model, suite_digest, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT DO NOTHING",
        )
        .bind(&queue.queue)
        .bind(&queue.model)
        .bind(&queue.suite_digest)
        .bind(now())
        .execute(self.pool())
        .await
        .map_err(q("registering a job queue"))?;
        Ok(())
    }

    /// Every registered queue.
    pub async fn job_queues(&self) -> Result<Vec<JobQueue>, StoreError> {
        let rows =
            sqlx::query("SELECT queue, model, suite_digest FROM job_queues ORDER BY created_at")
                .fetch_all(self.pool())
                .await
                .map_err(q("listing job queues"))?;
        Ok(rows
            .iter()
            .map(|r| JobQueue {
                queue: r.get(0),
                model: r.get(1),
                suite_digest: r.get(2),
            })
            .collect())
    }

    /// Writes a job's result. The first complete result under a key is kept: a later one (the same job run
    /// twice) is dropped, and `false` is returned; only a result the worker gave up on may be replaced.
    pub async fn put_job_result(&self, r: &JobResult) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "INSERT INTO job_results (key, queue, result, trajectory, infra, worker, attempts, model_ms, \
             queue_ms, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
             ON CONFLICT (key) DO UPDATE SET queue = excluded.queue, result = excluded.result, \
             trajectory = excluded.trajectory, infra = excluded.infra, worker = excluded.worker, \
             attempts = excluded.attempts, model_ms = excluded.model_ms, queue_ms = excluded.queue_ms, \
             created_at = excluded.created_at WHERE job_results.infra = 1 AND excluded.infra = 0",
        )
        .bind(&r.key)
        .bind(&r.queue)
        .bind(&r.result)
        .bind(r.trajectory.as_deref())
        .bind(i64::from(r.infra))
        .bind(&r.worker)
        .bind(r.attempts)
        .bind(r.model_ms)
        .bind(r.queue_ms)
        .bind(now())
        .execute(self.pool())
        .await
        .map_err(q("writing a job result"))?;
        Ok(done.rows_affected() > 0)
    }

    /// The results written under any of `keys`, by key.
    pub async fn job_results(
        &self,
        keys: &[String],
    ) -> Result<HashMap<String, JobResult>, StoreError> {
        let mut found = HashMap::new();
        for chunk in keys.chunks(LOOKUP_CHUNK) {
            let sql = format!(
                "SELECT key, queue, result, trajectory, infra, worker, attempts, model_ms, queue_ms \
                 FROM job_results WHERE key IN ({})",
                placeholders(1, chunk.len())
            );
            let mut query = sqlx::query(&sql);
            for key in chunk {
                query = query.bind(key.as_str());
            }
            let rows = query
                .fetch_all(self.pool())
                .await
                .map_err(q("reading job results"))?;
            for r in &rows {
                let infra: i64 = r.get(4);
                let key: String = r.get(0);
                found.insert(
                    key.clone(),
                    JobResult {
                        key,
                        queue: r.get(1),
                        result: r.get(2),
                        trajectory: r.get(3),
                        infra: infra != 0,
                        worker: r.get(5),
                        attempts: r.get(6),
                        model_ms: r.get(7),
                        queue_ms: r.get(8),
                    },
                );
            }
        }
        Ok(found)
    }

    /// Forgets the given-up results among `keys`, so that their jobs can be queued again (a resumed run tries
    /// what failed for want of a server, as a run on one machine does).
    pub async fn forget_failed_job_results(&self, keys: &[String]) -> Result<u64, StoreError> {
        let mut n = 0;
        for chunk in keys.chunks(LOOKUP_CHUNK) {
            let sql = format!(
                "DELETE FROM job_results WHERE infra = 1 AND key IN ({})",
                placeholders(1, chunk.len())
            );
            let mut query = sqlx::query(&sql);
            for key in chunk {
                query = query.bind(key.as_str());
            }
            n += query
                .execute(self.pool())
                .await
                .map_err(q("forgetting failed job results"))?
                .rows_affected();
        }
        Ok(n)
    }

    /// A worker's report of itself: created on its first, updated after.
    pub async fn report_worker(&self, w: &WorkerRow) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO job_workers (id, host, model, started_at, last_seen, jobs_done, failures, state) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (id) DO UPDATE SET \
             last_seen = excluded.last_seen, jobs_done = excluded.jobs_done, failures = excluded.failures, \
             state = excluded.state",
        )
        .bind(&w.id)
        .bind(&w.host)
        .bind(&w.model)
        .bind(&w.started_at)
        .bind(&w.last_seen)
        .bind(w.jobs_done)
        .bind(w.failures)
        .bind(&w.state)
        .execute(self.pool())
        .await
        .map_err(q("reporting a worker"))?;
        Ok(())
    }

    /// Per queue: results written, and how many of them are given-up jobs.
    pub async fn job_result_counts(&self) -> Result<HashMap<String, (i64, i64)>, StoreError> {
        let rows = sqlx::query(
            "SELECT queue, COUNT(*), COALESCE(SUM(infra), 0) FROM job_results GROUP BY queue",
        )
        .fetch_all(self.pool())
        .await
        .map_err(q("counting job results"))?;
        Ok(rows
            .iter()
            .map(|r| {
                (
                    r.get::<String, _>(0),
                    (r.get::<i64, _>(1), r.get::<i64, _>(2)),
                )
            })
            .collect())
    }

    /// Workers, most recently seen first.
    pub async fn workers(&self) -> Result<Vec<WorkerRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, host, model, started_at, last_seen, jobs_done, failures, state FROM job_workers \
             ORDER BY last_seen DESC",
        )
        .fetch_all(self.pool())
        .await
        .map_err(q("listing workers"))?;
        Ok(rows
            .iter()
            .map(|r| WorkerRow {
                id: r.get(0),
                host: r.get(1),
                model: r.get(2),
                started_at: r.get(3),
                last_seen: r.get(4),
                jobs_done: r.get(5),
                failures: r.get(6),
                state: r.get(7),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(key: &str, infra: bool, worker: &str) -> JobResult {
        JobResult {
            key: key.into(),
            queue: "q".into(),
            result: format!("{{\"by\":\"{worker}\"}}"),
            trajectory: None,
            infra,
            worker: worker.into(),
            attempts: 1,
            model_ms: 10.0,
            queue_ms: 1.5,
        }
    }

    #[tokio::test]
    async fn the_first_complete_result_is_kept_and_only_a_given_up_one_is_replaced() {
        let dir = tempfile::tempdir().expect("the test store answers");
        let store = Store::open(&dir.path().join("s.db").display().to_string())
            .await
            .expect("the test store answers");
        assert!(
            store
                .put_job_result(&result("a", false, "w1"))
                .await
                .expect("the test store answers")
        );
        assert!(
            !store
                .put_job_result(&result("a", false, "w2"))
                .await
                .expect("the test store answers")
        );
        assert!(
            store
                .put_job_result(&result("b", true, "w1"))
                .await
                .expect("the test store answers")
        );
        assert!(
            !store
                .put_job_result(&result("b", true, "w3"))
                .await
                .expect("the test store answers")
        );
        assert!(
            store
                .put_job_result(&result("b", false, "w2"))
                .await
                .expect("the test store answers")
        );
        let got = store
            .job_results(&["a".into(), "b".into(), "c".into()])
            .await
            .expect("the test store answers");
        assert_eq!(got.len(), 2);
        assert_eq!(got["a"].worker, "w1");
        assert_eq!(got["b"].worker, "w2");
        assert!(!got["b"].infra);
        assert_eq!(got["a"].queue_ms, 1.5);
        // Forgetting touches given-up results only.
        store
            .put_job_result(&result("c", true, "w1"))
            .await
            .expect("the test store answers");
        assert_eq!(
            store
                .forget_failed_job_results(&["a".into(), "c".into()])
                .await
                .expect("the test store answers"),
            1
        );
        assert_eq!(
            store
                .job_results(&["a".into(), "c".into()])
                .await
                .expect("the test store answers")
                .len(),
            1
        );
    }

    #[tokio::test]
    async fn suites_queues_and_workers_round_trip() {
        let dir = tempfile::tempdir().expect("the test store answers");
        let store = Store::open(&dir.path().join("s.db").display().to_string())
            .await
            .expect("the test store answers");
        let suite = JobSuite {
            digest: "d1".into(),
            name: "contractor".into(),
            text: "name = \"contractor\"".into(),
            origin: "datasets/suites/contractor.toml".into(),
            fixture_digest: String::new(),
        };
        store
            .save_job_suite(&suite)
            .await
            .expect("the test store answers");
        store
            .save_job_suite(&suite)
            .await
            .expect("the test store answers");
        assert_eq!(
            store.job_suite("d1").await.expect("the test store answers"),
            Some(suite)
        );
        assert_eq!(
            store.job_suite("d2").await.expect("the test store answers"),
            None
        );
        let queue = JobQueue {
            queue: "tt_abc".into(),
            model: "m".into(),
            suite_digest: "d1".into(),
        };
        store
            .register_job_queue(&queue)
            .await
            .expect("the test store answers");
        store
            .register_job_queue(&queue)
            .await
            .expect("the test store answers");
        assert_eq!(
            store.job_queues().await.expect("the test store answers"),
            vec![queue]
        );
        let mut w = WorkerRow {
            id: "h pid 1".into(),
            host: "h".into(),
            model: "m".into(),
            started_at: "2026-12-04T00:00:00.000Z".into(),
            last_seen: "2026-12-04T00:00:00.000Z".into(),
            jobs_done: 0,
            failures: 0,
            state: "idle".into(),
        };
        store
            .report_worker(&w)
            .await
            .expect("the test store answers");
        w.jobs_done = 3;
        w.state = "busy".into();
        w.last_seen = "2026-12-04T00:00:05.000Z".into();
        store
            .report_worker(&w)
            .await
            .expect("the test store answers");
        assert_eq!(
            store.workers().await.expect("the test store answers"),
            vec![w]
        );
    }
}

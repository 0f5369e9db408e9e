//! The driver's side of the queue: send an evaluation's jobs and wait for their results. A result already written
//! (by a worker while the driver was down, or for another run with the same key) is used as it is; a job still
//! queued is not sent again; so a resumed run queues only what has no result.

use crate::job::{Job, agent_identity, queue_name};
use crate::queue::Queue;
use crate::{WorkerError, bounded};
use std::collections::HashMap;
use std::time::{Duration, Instant};
pub use tooltune_run::WorkerPolicy;
use tooltune_store::{JobQueue, JobResult, JobSuite, Store};

/// Sends jobs for one agent model and suite, and collects their results.
#[derive(Debug, Clone)]
pub struct Dispatcher {
    store: Store,
    queue: Queue,
    name: String,
    model: String,
    suite_digest: String,
    policy: WorkerPolicy,
}

/// How often the driver looks for results while it waits.
const POLL: Duration = Duration::from_millis(50);
/// How long the driver waits without a new result before it says why nothing is happening.
const STALL: Duration = Duration::from_secs(60);
/// How long one call to the store or the queue may take. A link that drops packets without a reset gives no
/// socket error, and a poll stuck on it would also keep Ctrl-C from being heard (the stop is asked between polls).
const CALL_LIMIT: Duration = Duration::from_secs(20);
/// How long the wait for results goes on through a store that fails or does not answer, before the run ends with
/// the error (resumable: the jobs stay queued and results written meanwhile are used).
const LOST_LIMIT: Duration = Duration::from_secs(300);

impl Dispatcher {
    /// Opens the queue of the agent model (its id and `ChatModel::numerics`) and the suite (stored by content
    /// address for the workers), creating it if needed. The store must be PostgreSQL.
    pub async fn open(
        store: &Store,
        agent_model_id: &str,
        agent_numerics: &str,
        suite: &JobSuite,
        policy: WorkerPolicy,
    ) -> Result<Dispatcher, WorkerError> {
        let queue = Queue::connect(store.database_url()).await?;
        store.save_job_suite(suite).await?;
        let model = agent_identity(agent_model_id, agent_numerics);
        let name = queue_name(&model, &suite.digest);
        queue.ensure(&name).await?;
        store
            .register_job_queue(&JobQueue {
                queue: name.clone(),
                model: model.clone(),
                suite_digest: suite.digest.clone(),
            })
            .await?;
        Ok(Dispatcher {
            store: store.clone(),
            queue,
            name,
            model,
            suite_digest: suite.digest.clone(),
            policy,
        })
    }

    /// The agent identity jobs are sent for (what a worker's model must be).
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The suite's content address.
    pub fn suite_digest(&self) -> &str {
        &self.suite_digest
    }

    /// The run's policy.
    pub fn policy(&self) -> &WorkerPolicy {
        &self.policy
    }

    /// Sends the jobs that have no result yet and waits until every job has one; returns them in job order. A
    /// result the workers gave up on before this call is dropped and its job sent again (as a run on one machine
    /// tries again what failed for want of a server); one they give up on during it is returned. `stopped` is
    /// asked at every poll: once it says yes, the wait ends with [`WorkerError::Interrupted`] (with no worker
    /// running, a wait would otherwise never end).
    pub async fn run(
        &self,
        jobs: &[Job],
        stopped: &(dyn Fn() -> bool + Sync),
    ) -> Result<Vec<JobResult>, WorkerError> {
        let keys: Vec<String> = jobs.iter().map(|j| j.key.clone()).collect();
        let before = bounded(
            CALL_LIMIT,
            "looking up results",
            self.store.job_results(&keys),
        )
        .await?;
        let failed: Vec<String> = before
            .values()
            .filter(|r| r.infra)
            .map(|r| r.key.clone())
            .collect();
        bounded(
            CALL_LIMIT,
            "clearing given-up results",
            self.store.forget_failed_job_results(&failed),
        )
        .await?;
        let mut done: HashMap<String, JobResult> =
            before.into_iter().filter(|(_, r)| !r.infra).collect();
        let unsent: Vec<String> = keys
            .iter()
            .filter(|k| !done.contains_key(*k))
            .cloned()
            .collect();
        let queued = bounded(
            CALL_LIMIT,
            "looking up queued jobs",
            self.queue.queued_keys(&self.name, &unsent),
        )
        .await?;
        let to_send: Vec<Job> = jobs
            .iter()
            .filter(|j| !done.contains_key(&j.key) && !queued.contains(&j.key))
            .cloned()
            .collect();
        bounded(
            CALL_LIMIT,
            "sending jobs",
            self.queue.send(&self.name, &to_send),
        )
        .await?;
        tracing::debug!(
            queue = %self.name,
            sent = to_send.len(),
            already_done = done.len(),
            already_queued = queued.len(),
            "jobs sent"
        );
        let mut last_news = Instant::now();
        let mut warned = false;
        // Since when the store has failed or not answered, while waiting.
        let mut lost: Option<Instant> = None;
        while done.len() < keys.len() {
            tokio::time::sleep(POLL).await;
            let waiting: Vec<String> = keys
                .iter()
                .filter(|k| !done.contains_key(*k))
                .cloned()
                .collect();
            let poll = bounded(
                CALL_LIMIT,
                "waiting for results",
                self.store.job_results(&waiting),
            );
            let found = match poll.await {
                Ok(found) => {
                    if let Some(since) = lost.take() {
                        tracing::info!(
                            "the store answers again after {:.0} s",
                            since.elapsed().as_secs_f64()
                        );
                    }
                    found
                }
                // The workers go on without the driver; results they write meanwhile are read once the store
                // answers. Only a long outage ends the run.
                Err(e @ (WorkerError::TimedOut { .. } | WorkerError::Store(_))) => {
                    let since = *lost.get_or_insert_with(|| {
                        tracing::warn!("{e}; still waiting for results (Ctrl-C stops the run, its jobs stay queued)");
                        Instant::now()
                    });
                    if stopped() {
                        return Err(WorkerError::Interrupted {
                            waiting: waiting.len(),
                            queue: self.name.clone(),
                        });
                    }
                    if since.elapsed() >= LOST_LIMIT {
                        return Err(e);
                    }
                    // A refused connection fails at once: do not hammer it.
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if found.len() < waiting.len() && stopped() {
                return Err(WorkerError::Interrupted {
                    waiting: waiting.len() - found.len(),
                    queue: self.name.clone(),
                });
            }
            if !found.is_empty() {
                last_news = Instant::now();
                warned = false;
            }
            done.extend(found);
            if !warned && last_news.elapsed() >= STALL {
                warned = true;
                tracing::warn!("{}", self.stall_reason(waiting.len()).await);
            }
        }
        Ok(keys.iter().filter_map(|k| done.remove(k)).collect())
    }

    /// Why no result has come for a while, as a user can act on it.
    async fn stall_reason(&self, waiting: usize) -> String {
        let recent = chrono::Utc::now() - chrono::Duration::seconds(30);
        let live = self
            .store
            .workers()
            .await
            .unwrap_or_default()
            .into_iter()
            .filter(|w| w.model == self.model && w.state != "stopped")
            .filter(|w| {
                chrono::DateTime::parse_from_rfc3339(&w.last_seen)
                    .is_ok_and(|t| t.with_timezone(&chrono::Utc) >= recent)
            })
            .count();
        if live == 0 {
            format!(
                "{waiting} jobs wait in queue {} and no worker for this model has reported in the last 30 s: \
                 start `tooltune worker` against this database with the same model ({})",
                self.name, self.model
            )
        } else {
            format!(
                "{waiting} jobs wait in queue {}; {live} workers for this model are alive but no result came for \
                 {} s (a slow model, or workers that cannot serve this suite: see their logs)",
                self.name,
                STALL.as_secs()
            )
        }
    }
}

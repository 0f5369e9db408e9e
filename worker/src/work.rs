//! The worker loop (`tooltune worker`): take jobs for the model this process has from the queues of suites it can
//! serve, play them as model batches against the suite's server on this machine, write each result once under
//! its key, and archive the messages. While a batch plays, its messages' visibility is extended, so only a worker
//! that stops answering (killed, cut off) loses its jobs to another.

use crate::job::{self, Job, Verdict};
use crate::queue::{Queue, Taken};
use crate::{WorkerError, bounded, suites};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};
use tooltune_evaluator::evaluate::{Candidate, EvalOptions, TaskResult, evaluate};
use tooltune_evaluator::host::HostConfig;
use tooltune_evaluator::{McpServer, Suite};
use tooltune_llm::ChatModel;
use tooltune_store::{JobResult, Store, WorkerRow};

/// How a worker works.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Jobs taken at once, played as one model batch when they share a candidate.
    pub concurrency: usize,
    /// How long a taken job stays invisible to other workers without a heartbeat; a killed worker's jobs come
    /// back after this.
    pub visibility: Duration,
    /// Folders where suite files (and what they reference) are looked for, first to last.
    pub suite_dirs: Vec<PathBuf>,
    /// How long to wait between looks at empty queues.
    pub poll: Duration,
    /// Stop after this long with nothing to do (`None`: run until stopped).
    pub idle_exit: Option<Duration>,
    /// How long a job that failed for want of infrastructure waits before it may be taken again.
    pub retry_delay: Duration,
    /// How long one call to the store or the queue may take. A network cut that drops packets silently (no reset,
    /// no FIN) leaves a query waiting forever on an open socket; past this limit the call is abandoned and the
    /// worker treats the store as lost, as it does when the connection is refused.
    pub store_timeout: Duration,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        WorkerOptions {
            concurrency: 8,
            visibility: Duration::from_secs(60),
            suite_dirs: Vec::new(),
            poll: Duration::from_millis(200),
            idle_exit: None,
            retry_delay: Duration::from_secs(2),
            store_timeout: Duration::from_secs(20),
        }
    }
}

/// What a worker tells its caller as it goes.
#[derive(Debug, Clone)]
pub enum WorkerEvent {
    /// It has started and serves this model identity.
    Started {
        /// The worker's id.
        id: String,
        /// The agent identity it serves.
        model: String,
    },
    /// It cannot serve a suite (reported once per suite): its jobs are left to other workers.
    CannotServe {
        /// Why.
        reason: String,
    },
    /// Jobs were taken and are being played.
    Taken {
        /// The suite's name.
        suite: String,
        /// How many.
        jobs: usize,
    },
    /// The store (and so the queue) cannot be reached: the worker keeps trying, with a growing pause, instead of
    /// exiting, so a network cut between machines costs the jobs it held (they come back to the queue after their
    /// visibility timeout) and not the worker.
    StoreLost {
        /// The error of the last try.
        error: String,
        /// Seconds until the next try.
        retry_in_s: f64,
    },
    /// The store answered again after it was lost.
    StoreBack {
        /// How long it was gone.
        seconds: f64,
    },
    /// A batch finished.
    Batch {
        /// The suite's name.
        suite: String,
        /// Jobs in the batch.
        jobs: usize,
        /// Results written (a job already done elsewhere writes none).
        written: usize,
        /// Jobs left for another attempt.
        retried: usize,
        /// Jobs given up as infrastructure failures.
        given_up: usize,
        /// Wall time of the batch.
        seconds: f64,
    },
}

/// A worker's totals.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct WorkerTotals {
    /// Results written.
    pub jobs_done: i64,
    /// Jobs not finished (left for another attempt or given up).
    pub failures: i64,
}

struct Served {
    suite: Suite,
    server: McpServer,
}

struct Counters {
    done: AtomicI64,
    failed: AtomicI64,
    busy: AtomicBool,
}

/// This machine's name, to tell workers (and the driver's leases) of machines sharing a store apart.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Runs until `stop` is set (or, with `idle_exit`, until idle that long). The model must be the one the jobs
/// name: jobs of other models stay in their own queues.
pub async fn work(
    store: &Store,
    queue: &Queue,
    model: Arc<dyn ChatModel>,
    opts: &WorkerOptions,
    stop: Arc<AtomicBool>,
    on_event: &(dyn Fn(&WorkerEvent) + Send + Sync),
) -> Result<WorkerTotals, WorkerError> {
    let identity = job::agent_identity(&model.id(), &model.numerics());
    let host = hostname();
    let id = format!(
        "{host} pid {} ({})",
        std::process::id(),
        &uuid::Uuid::new_v4().simple().to_string()[..6]
    );
    let counters = Arc::new(Counters {
        done: AtomicI64::new(0),
        failed: AtomicI64::new(0),
        busy: AtomicBool::new(false),
    });
    let template = WorkerRow {
        id: id.clone(),
        host: host.clone(),
        model: identity.clone(),
        started_at: now(),
        last_seen: String::new(),
        jobs_done: 0,
        failures: 0,
        state: String::new(),
    };
    let row = move |state: &str, c: &Counters| WorkerRow {
        last_seen: now(),
        jobs_done: c.done.load(Ordering::Relaxed),
        failures: c.failed.load(Ordering::Relaxed),
        state: state.to_string(),
        ..template.clone()
    };
    let limit = opts.store_timeout;
    bounded(
        limit,
        "registering this worker",
        store.report_worker(&row("idle", &counters)),
    )
    .await?;
    on_event(&WorkerEvent::Started {
        id: id.clone(),
        model: identity.clone(),
    });
    // The worker's own report, every few seconds, whatever it is doing.
    let reporter = {
        let (store, counters, row) = (store.clone(), Arc::clone(&counters), row.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                let state = if counters.busy.load(Ordering::Relaxed) {
                    "busy"
                } else {
                    "idle"
                };
                let r = row(state, &counters);
                let report = bounded(limit, "reporting this worker", store.report_worker(&r));
                if let Err(e) = report.await {
                    tracing::warn!("{e}");
                }
            }
        })
    };
    let mut served: HashMap<String, Result<Served, String>> = HashMap::new();
    let mut idle_since = Instant::now();
    // When the store was lost and how many tries have failed since.
    let mut lost: Option<(Instant, u32)> = None;
    let result: Result<(), WorkerError> = loop {
        if stop.load(Ordering::Relaxed) {
            break Ok(());
        }
        let queues = match bounded(limit, "looking for job queues", store.job_queues()).await {
            Ok(q) => {
                if let Some((since, _)) = lost.take() {
                    on_event(&WorkerEvent::StoreBack {
                        seconds: since.elapsed().as_secs_f64(),
                    });
                }
                q
            }
            Err(e) => {
                let (since, tries) = lost.unwrap_or((Instant::now(), 0));
                let pause = lost_pause(tries);
                lost = Some((since, tries + 1));
                on_event(&WorkerEvent::StoreLost {
                    error: e.to_string(),
                    retry_in_s: pause.as_secs_f64(),
                });
                // Stop is honoured during the pause too, so Ctrl-C does not wait out a long one.
                let until = Instant::now() + pause;
                while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                continue;
            }
        };
        let mut worked = false;
        for q in queues.iter().filter(|q| q.model == identity) {
            if !served.contains_key(&q.suite_digest) {
                let resolved = bounded(
                    limit,
                    "reading a suite",
                    suites::resolve(store, &q.suite_digest, &opts.suite_dirs),
                );
                let s = match resolved.await {
                    // Not this machine's fault: the store failed or went quiet. Look again on the next round
                    // instead of marking the suite as one this worker cannot serve.
                    Err(e @ (WorkerError::TimedOut { .. } | WorkerError::Store(_))) => {
                        tracing::warn!("{e}");
                        continue;
                    }
                    Ok(suite) => match suite.connect().await {
                        Ok(server) => Ok(Served { suite, server }),
                        Err(e) => Err(format!(
                            "suite `{}`: its server does not start here: {e}",
                            suite.name
                        )),
                    },
                    Err(e) => Err(e.to_string()),
                };
                if let Err(reason) = &s {
                    tracing::warn!("{reason}; leaving its jobs to other workers");
                    on_event(&WorkerEvent::CannotServe {
                        reason: reason.clone(),
                    });
                }
                served.insert(q.suite_digest.clone(), s);
            }
            let Some(Ok(s)) = served.get(&q.suite_digest) else {
                continue;
            };
            let t0 = Instant::now();
            let read = bounded(
                limit,
                "taking jobs",
                queue.read(&q.queue, opts.visibility, opts.concurrency),
            );
            let taken = match read.await {
                Ok(t) => t,
                Err(e) => {
                    tracing::warn!("reading queue {}: {e}", q.queue);
                    continue;
                }
            };
            if taken.is_empty() {
                continue;
            }
            let read_s = t0.elapsed().as_secs_f64();
            on_event(&WorkerEvent::Taken {
                suite: s.suite.name.clone(),
                jobs: taken.len(),
            });
            worked = true;
            counters.busy.store(true, Ordering::Relaxed);
            let event = play(
                store,
                queue,
                &q.queue,
                s,
                model.as_ref(),
                opts,
                &id,
                taken,
                read_s,
                &counters,
            )
            .await;
            counters.busy.store(false, Ordering::Relaxed);
            match event {
                Ok(e) => on_event(&e),
                Err(e) => tracing::warn!("queue {}: {e}", q.queue),
            }
            // Look at every queue again after each batch, so a long queue does not starve the others.
            break;
        }
        if worked {
            idle_since = Instant::now();
        } else {
            if opts.idle_exit.is_some_and(|d| idle_since.elapsed() >= d) {
                break Ok(());
            }
            tokio::time::sleep(opts.poll).await;
        }
    };
    reporter.abort();
    for s in served.into_values().flatten() {
        s.server.shutdown().await;
    }
    let r = row("stopped", &counters);
    let report = bounded(
        limit,
        "reporting this worker stopped",
        store.report_worker(&r),
    );
    if let Err(e) = report.await {
        tracing::warn!("{e}");
    }
    result.map(|()| WorkerTotals {
        jobs_done: counters.done.load(Ordering::Relaxed),
        failures: counters.failed.load(Ordering::Relaxed),
    })
}

/// The pause before the next try after `tries` failed looks at the store: 1 s, doubling, at most 30 s.
fn lost_pause(tries: u32) -> Duration {
    Duration::from_secs(1u64 << tries.min(5)).min(Duration::from_secs(30))
}

/// What became of one taken job.
enum Fate {
    /// A result to write (complete, or a given-up infrastructure failure).
    Write(Box<TaskResult>, Option<String>, bool),
    /// Leave it for another attempt.
    Retry,
    /// Nothing to do: a result is already stored.
    Done,
}

#[allow(clippy::too_many_arguments)]
async fn play(
    store: &Store,
    queue: &Queue,
    name: &str,
    served: &Served,
    model: &dyn ChatModel,
    opts: &WorkerOptions,
    worker: &str,
    taken: Vec<Taken>,
    read_s: f64,
    counters: &Counters,
) -> Result<WorkerEvent, WorkerError> {
    let started = Instant::now();
    let mut queue_s = read_s;
    let n = taken.len();
    // A job already answered (its earlier worker wrote the result and died before archiving) is only archived.
    let keys: Vec<String> = taken.iter().filter_map(|t| t.key.clone()).collect();
    let t0 = Instant::now();
    let limit = opts.store_timeout;
    let have = bounded(limit, "looking up results", store.job_results(&keys)).await?;
    queue_s += t0.elapsed().as_secs_f64();
    let mut fates: Vec<Fate> = Vec::with_capacity(n);
    let mut runnable: Vec<(usize, Job)> = Vec::new();
    for (i, t) in taken.iter().enumerate() {
        let fate = match (&t.job, t.key.as_ref().and_then(|k| have.get(k))) {
            (_, Some(r)) if !r.infra => Fate::Done,
            (Err(e), _) => {
                // Not a job this version understands: answering it keeps the driver from waiting forever.
                let msg = format!("unreadable job: {e}");
                tracing::warn!(queue = name, "{msg}");
                Fate::Write(
                    Box::new(TaskResult::infrastructure_failure("?", None, msg)),
                    None,
                    true,
                )
            }
            (Ok(job), _) => match job::verdict(job, t.attempt) {
                Verdict::GiveUp => Fate::Write(
                    Box::new(TaskResult::infrastructure_failure(
                        &job.task_id,
                        owner(&served.suite, &job.task_id),
                        format!(
                            "given up after {} attempts: each worker that took it stopped answering",
                            job.max_attempts
                        ),
                    )),
                    None,
                    true,
                ),
                Verdict::Run => {
                    runnable.push((i, job.clone()));
                    Fate::Retry
                }
            },
        };
        fates.push(fate);
    }
    // The batch's messages stay invisible while it plays.
    let ids: Vec<i64> = runnable.iter().map(|(i, _)| taken[*i].msg_id).collect();
    let heartbeat = {
        let (queue, name, ids, vt) = (
            queue.clone(),
            name.to_string(),
            ids.clone(),
            opts.visibility,
        );
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(vt / 3).await;
                // Bounded by the beat itself: a beat stuck on a silent network must not hold up the next one,
                // and if none gets through the jobs go back to the queue, which is what a cut-off worker wants.
                let beat = bounded(
                    vt / 3,
                    "extending the visibility of jobs in play",
                    queue.extend(&name, &ids, vt),
                );
                if let Err(e) = beat.await {
                    tracing::warn!("{e}");
                }
            }
        })
    };
    let jobs: Vec<Job> = runnable.iter().map(|(_, j)| j.clone()).collect();
    let mut model_s = 0.0;
    for group in job::batches(&jobs, opts.concurrency) {
        let first = &jobs[group[0]];
        let span = tracing::info_span!(
            "jobs",
            run = first.run_id.as_deref().unwrap_or("-"),
            candidate = first.candidate_id.as_deref().unwrap_or("-"),
            tasks = %group.iter().map(|&g| jobs[g].task_id.as_str()).collect::<Vec<_>>().join(","),
        );
        let _enter = span.enter();
        let eval_opts = EvalOptions {
            task_ids: group.iter().map(|&g| jobs[g].task_id.clone()).collect(),
            target: Some(first.target.clone()),
            mode: first.mode,
            batch: group.len(),
            run_id: first.run_id.clone(),
            candidate_id: first.candidate_id.clone(),
            rollout: first.rollout,
            host: HostConfig {
                seed: first.seed,
                ..HostConfig::default()
            },
            call_timeout: Duration::from_millis(first.call_timeout_ms),
            ..EvalOptions::default()
        };
        let candidate = Candidate {
            descriptions: first.descriptions.clone(),
        };
        drop(_enter);
        let t0 = Instant::now();
        let outcome = evaluate(
            &served.suite,
            &served.server,
            model,
            None,
            &candidate,
            &eval_opts,
            |_, _| {},
        )
        .await;
        model_s += t0.elapsed().as_secs_f64();
        match outcome {
            Ok(result) => {
                let mut trajectories: HashMap<String, &tooltune_core::Trajectory> = result
                    .trajectories
                    .iter()
                    .map(|t| (t.id().to_string(), t))
                    .collect();
                for r in result.tasks {
                    let Some(&g) = group.iter().find(|&&g| jobs[g].task_id == r.task_id) else {
                        continue;
                    };
                    let (i, job) = &runnable[g];
                    if r.infra_failure.is_some()
                        && job::verdict(job, taken[*i].attempt + 1) == Verdict::Run
                    {
                        fates[*i] = Fate::Retry;
                        continue;
                    }
                    let trajectory = r
                        .trajectory_id
                        .as_ref()
                        .and_then(|id| trajectories.remove(id))
                        .map(|t| serde_json::to_string(t).unwrap_or_default());
                    let infra = r.infra_failure.is_some();
                    fates[*i] = Fate::Write(Box::new(r), trajectory, infra);
                }
            }
            Err(e) => {
                tracing::warn!("a batch of {} jobs failed: {e}", group.len());
                for &g in &group {
                    let (i, job) = &runnable[g];
                    if job::verdict(job, taken[*i].attempt + 1) == Verdict::GiveUp {
                        fates[*i] = Fate::Write(
                            Box::new(TaskResult::infrastructure_failure(
                                &job.task_id,
                                owner(&served.suite, &job.task_id),
                                format!("after {} attempts: {e}", taken[*i].attempt),
                            )),
                            None,
                            true,
                        );
                    }
                }
            }
        }
        // A server that died in this batch is started again for the next one.
        if !served.server.is_alive().await
            && let Err(e) = served.server.restart().await
        {
            tracing::warn!("restarting the suite's server: {e}");
        }
    }
    heartbeat.abort();
    // Write, then archive: a worker killed in between leaves a message whose result exists, which the next
    // worker to read it only archives.
    let (mut written, mut retried, mut given_up) = (0, 0, 0);
    let mut finished = Vec::new();
    let mut retry = Vec::new();
    let per_job_model_ms = model_s * 1000.0 / runnable.len().max(1) as f64;
    let mut to_write = Vec::new();
    for (i, fate) in fates.into_iter().enumerate() {
        match fate {
            Fate::Done => finished.push(taken[i].msg_id),
            Fate::Retry => {
                retry.push(taken[i].msg_id);
                retried += 1;
            }
            Fate::Write(r, trajectory, infra) => {
                let Some(key) = taken[i].key.clone() else {
                    finished.push(taken[i].msg_id);
                    continue;
                };
                given_up += usize::from(infra);
                to_write.push((i, key, r, trajectory, infra));
            }
        }
    }
    let queue_share_ms = (queue_s * 1000.0) / n as f64;
    for (i, key, r, trajectory, infra) in to_write {
        let row = JobResult {
            key,
            queue: name.to_string(),
            result: serde_json::to_string(&r).unwrap_or_default(),
            trajectory,
            infra,
            worker: worker.to_string(),
            attempts: i64::from(taken[i].attempt),
            model_ms: if infra { 0.0 } else { per_job_model_ms },
            // The batch's read and look-up, shared out (the write and archive that follow are not counted: the
            // driver's end-to-end figure holds them).
            queue_ms: queue_share_ms,
        };
        let put = bounded(limit, "writing a result", store.put_job_result(&row));
        if put.await? {
            written += 1;
        }
        finished.push(taken[i].msg_id);
    }
    bounded(
        limit,
        "archiving finished jobs",
        queue.archive(name, &finished),
    )
    .await?;
    bounded(
        limit,
        "releasing jobs for another attempt",
        queue.release(name, &retry, opts.retry_delay),
    )
    .await?;
    counters.done.fetch_add(written as i64, Ordering::Relaxed);
    counters
        .failed
        .fetch_add((retried + given_up) as i64, Ordering::Relaxed);
    Ok(WorkerEvent::Batch {
        suite: served.suite.name.clone(),
        jobs: n,
        written,
        retried,
        given_up,
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn owner(suite: &Suite, task: &str) -> Option<String> {
    suite
        .tasks
        .iter()
        .find(|t| t.id == task)
        .and_then(|t| t.owner.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_store_call_that_never_answers_ends_in_timed_out_and_one_that_answers_passes_through()
    {
        let limit = Duration::from_millis(50);
        let silent = bounded(
            limit,
            "taking jobs",
            std::future::pending::<Result<(), WorkerError>>(),
        )
        .await;
        assert!(
            matches!(
                silent,
                Err(WorkerError::TimedOut {
                    doing: "taking jobs",
                    ..
                })
            ),
            "{silent:?}"
        );
        let answered = bounded(limit, "taking jobs", async { Ok::<_, WorkerError>(7) }).await;
        assert_eq!(answered.ok(), Some(7));
    }

    #[test]
    fn a_lost_store_is_tried_again_after_pauses_that_double_from_one_second_to_at_most_thirty() {
        let pauses: Vec<u64> = (0..8).map(|t| lost_pause(t).as_secs()).collect();
        assert_eq!(pauses, [1, 2, 4, 8, 16, 30, 30, 30]);
    }
}

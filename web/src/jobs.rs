//! Optimisation runs as jobs inside the server's process. A run is created in the store first (so its id exists
//! and survives a restart), then a task drives it with `tooltune_driver::resume`, which starts a run without a
//! checkpoint from the beginning and continues one with a checkpoint where it stopped. At most `max_jobs` runs
//! execute at once; the others wait for a slot. Models are loaded once per spec and shared by later runs.
//!
//! The store is the truth: a job's progress is its events and checkpoints there. What lives here is only what a
//! process can hold: the stop signal, whether a job is queued or executing, and a counter that wakes event streams
//! when a job reports progress.

use crate::{ServeConfig, WebError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::{Semaphore, watch};
use tooltune_driver::{Event, Models, RunConfig, StopSignal};
use tooltune_llm::ChatModel;
use tooltune_store::{RunKind, RunStatus, Store};

/// Where a job of this process stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobState {
    /// Waiting for a free slot.
    Queued,
    /// Executing.
    Running,
}

impl JobState {
    /// The name the API and pages use.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
        }
    }
}

struct Job {
    stop: StopSignal,
    started: Arc<AtomicBool>,
    ticks: Arc<watch::Sender<u64>>,
    task: Option<tokio::task::AbortHandle>,
}

struct JobsInner {
    store: Store,
    models_allowed: Vec<String>,
    api_key_env: Option<String>,
    slots: Semaphore,
    active: Mutex<HashMap<String, Job>>,
    models: tokio::sync::Mutex<HashMap<String, Arc<dyn ChatModel>>>,
}

/// The jobs of this process. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Jobs(Arc<JobsInner>);

impl Jobs {
    pub(crate) fn new(store: Store, cfg: &ServeConfig) -> Jobs {
        Jobs(Arc::new(JobsInner {
            store,
            models_allowed: cfg.models.clone(),
            api_key_env: cfg.api_key_env.clone(),
            slots: Semaphore::new(cfg.max_jobs),
            active: Mutex::new(HashMap::new()),
            models: tokio::sync::Mutex::new(HashMap::new()),
        }))
    }

    fn active(&self) -> MutexGuard<'_, HashMap<String, Job>> {
        // A poisoned lock means a panic while holding it, which only inserts and removes; the map is still sound.
        self.0.active.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a model spec is one the operator allowed.
    pub(crate) fn model_allowed(&self, spec: &str) -> bool {
        self.0.models_allowed.iter().any(|m| m == spec)
    }

    /// The default model spec.
    pub(crate) fn default_model(&self) -> &str {
        self.0
            .models_allowed
            .first()
            .map(String::as_str)
            .unwrap_or("local")
    }

    /// The allowed model specs.
    pub(crate) fn models_allowed(&self) -> &[String] {
        &self.0.models_allowed
    }

    /// Records a new run and queues it. Returns its id.
    pub(crate) async fn create(&self, cfg: &RunConfig) -> Result<String, WebError> {
        // The same shape as the driver's own ids, so runs started here and by the CLI look alike.
        let id = format!("run-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let config = serde_json::to_string(cfg)
            .map_err(|e| WebError::Internal(format!("run configuration: {e}")))?;
        self.0
            .store
            .create_run(
                &id,
                RunKind::Optimize,
                Some(&cfg.suite.display().to_string()),
                cfg.objective,
                &config,
            )
            .await?;
        self.spawn(id.clone());
        Ok(id)
    }

    /// Queues every run the store lists as running that no job of ours drives. Returns their ids.
    pub(crate) async fn resume_unfinished(&self) -> Result<Vec<String>, WebError> {
        let mut ids = Vec::new();
        // Oldest first, so that they run in the order they were asked for.
        let mut rows = self.0.store.runs(100_000).await?;
        rows.reverse();
        for row in rows {
            // Only optimisation runs are jobs; a batch `from-traces` run is one short command, not resumable here.
            if row.kind == RunKind::Optimize
                && row.status == RunStatus::Running
                && !self.active().contains_key(&row.id)
            {
                self.spawn(row.id.clone());
                ids.push(row.id);
            }
        }
        Ok(ids)
    }

    fn spawn(&self, id: String) {
        let (ticks, _) = watch::channel(0u64);
        let job = Job {
            stop: StopSignal::default(),
            started: Arc::new(AtomicBool::new(false)),
            ticks: Arc::new(ticks),
            task: None,
        };
        let (stop, started, ticks) = (job.stop.clone(), job.started.clone(), job.ticks.clone());
        // Insert before the task can finish and remove itself: the lock is held across the spawn.
        let mut active = self.active();
        let this = self.clone();
        let run_id = id.clone();
        let handle = tokio::spawn(async move {
            this.execute(&run_id, stop, started, ticks.clone()).await;
            this.active().remove(&run_id);
            ticks.send_modify(|n| *n += 1);
        });
        active.insert(
            id,
            Job {
                task: Some(handle.abort_handle()),
                ..job
            },
        );
    }

    async fn execute(
        &self,
        id: &str,
        stop: StopSignal,
        started: Arc<AtomicBool>,
        ticks: Arc<watch::Sender<u64>>,
    ) {
        let store = &self.0.store;
        let Ok(_slot) = self.0.slots.acquire().await else {
            return;
        };
        if stop.is_set() {
            // Stopped while queued: nothing was spent, so there is nothing to report on either. If the store
            // refuses the status, the run stays `running` and is queued again at the next start; say so.
            if let Err(e) = store
                .finish_run(
                    id,
                    RunStatus::Stopped,
                    None,
                    Some("stopped before it started"),
                )
                .await
            {
                tracing::error!(
                    run = id,
                    "recording that the run stopped before it started: {e}"
                );
            }
            return;
        }
        started.store(true, Ordering::SeqCst);
        ticks.send_modify(|n| *n += 1);
        let outcome = match self.models_for(id).await {
            Ok(models) => {
                let on_event = move |_: &Event| ticks.send_modify(|n| *n += 1);
                tooltune_driver::resume(store, id, models, stop, &on_event)
                    .await
                    .map(|_| ())
                    .map_err(WebError::from)
            }
            Err(e) => Err(e),
        };
        if let Err(WebError::Driver(tooltune_driver::DriverError::Busy { owner, .. })) = &outcome {
            // Another process (a `tooltune optimize --resume`, a second server) is driving it; it stays theirs.
            tracing::info!(
                run = id,
                owner,
                "run is driven elsewhere; not resuming it here"
            );
            return;
        }
        if let Err(e) = outcome {
            tracing::warn!(run = id, "run failed: {e}");
            // The driver records failures of the search itself; failures before it began (the models, the suite,
            // the server's start) would leave the run `running` and resumed again at every start.
            match store.run(id).await {
                Ok(Some(row)) if row.status == RunStatus::Running => {
                    if let Err(store_error) = store
                        .finish_run(id, RunStatus::Failed, None, Some(&e.to_string()))
                        .await
                    {
                        tracing::error!(
                            run = id,
                            "recording the run's failure: {store_error}; it stays `running` and is resumed at the \
                             next start"
                        );
                    }
                }
                Ok(_) => {}
                Err(store_error) => tracing::error!(
                    run = id,
                    "reading the run back to record its failure: {store_error}; it may stay `running`"
                ),
            }
        }
    }

    /// The run's models, loaded once per spec for the life of the server.
    async fn models_for(&self, id: &str) -> Result<Models, WebError> {
        let row = self
            .0
            .store
            .run(id)
            .await?
            .ok_or_else(|| WebError::NotFound(format!("run `{id}`")))?;
        let cfg: RunConfig = serde_json::from_str(&row.config).map_err(|e| {
            WebError::Config(format!("run `{id}` has an unreadable configuration: {e}"))
        })?;
        for spec in [&cfg.agent, &cfg.reflector] {
            // A resumed run names its models in the store; the operator's list still decides where keys may go.
            if !self.model_allowed(spec) {
                return Err(WebError::Config(format!(
                    "model `{}` is not allowed on this server; resume the run with `tooltune optimize --resume {id}`",
                    view_spec(spec)
                )));
            }
        }
        let agent = self.model(&cfg.agent).await?;
        let reflector = if cfg.reflector == cfg.agent {
            agent.clone()
        } else {
            self.model(&cfg.reflector).await?
        };
        Ok(Models { agent, reflector })
    }

    async fn model(&self, spec: &str) -> Result<Arc<dyn ChatModel>, WebError> {
        let mut cache = self.0.models.lock().await;
        if let Some(m) = cache.get(spec) {
            return Ok(m.clone());
        }
        let parsed = tooltune_llm::BackendSpec::parse(spec, self.0.api_key_env.as_deref())
            .map_err(|e| WebError::Config(format!("model `{}`: {e}", view_spec(spec))))?;
        let model = tooltune_llm::build(&parsed)
            .await
            .map_err(|e| WebError::Config(format!("model `{}`: {e}", view_spec(spec))))?;
        cache.insert(spec.to_string(), model.clone());
        Ok(model)
    }

    /// Where a run of this process stands; `None` when no job of ours has it.
    pub(crate) fn state(&self, id: &str) -> Option<JobState> {
        self.active().get(id).map(|j| {
            if j.started.load(Ordering::SeqCst) {
                JobState::Running
            } else {
                JobState::Queued
            }
        })
    }

    /// Asks a run to stop after its current step. `false` when no job of ours has it.
    pub(crate) fn stop(&self, id: &str) -> bool {
        let active = self.active();
        let Some(job) = active.get(id) else {
            return false;
        };
        job.stop.stop();
        job.ticks.send_modify(|n| *n += 1);
        true
    }

    /// A receiver that changes whenever the run reports progress or ends; `None` when no job of ours has it.
    pub(crate) fn subscribe(&self, id: &str) -> Option<watch::Receiver<u64>> {
        self.active().get(id).map(|j| j.ticks.subscribe())
    }

    /// Drops every job where it stands (server shutdown). Their runs stay `running`, with their checkpoints, for
    /// the next server to resume.
    pub(crate) fn abandon_all(&self) {
        for (_, job) in self.active().drain() {
            if let Some(t) = job.task {
                t.abort();
            }
        }
    }
}

/// A model spec as shown to people: a password in its base URL is replaced by stars.
pub(crate) fn view_spec(spec: &str) -> String {
    match spec.split_once('@') {
        Some((model, url)) => format!("{model}@{}", tooltune_store::redact_url(url)),
        None => spec.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::view_spec;

    #[test]
    fn specs_are_redacted() {
        assert_eq!(view_spec("local:fast"), "local:fast");
        assert_eq!(
            view_spec("openai:gpt@https://u:secret@h.example/v1"),
            "openai:gpt@https://u:***@h.example/v1"
        );
    }
}

//! The driver around the pure GEPA search: it answers the search's actions with real work (rollouts against the
//! suite's MCP server through the evaluator, reflections through the reflector model), stores everything in the
//! trace store as it happens, and checkpoints the search after every step.
//!
//! Resume rests on two facts. The search is deterministic (same seed, same observations, same actions) and
//! `next()` repeats an unanswered action; and every effect the driver causes is stored under a deterministic key
//! before it is observed: rollout results by (run, candidate content, task, rollout index), reflections by (run,
//! parent, tool, minibatch). A resumed run loads the last checkpoint, repeats the action in flight, and finds the
//! rollouts and reflections that had finished in the store instead of redoing them.

mod from_traces;
mod gather;
mod summary;

pub use from_traces::{FromTracesConfig, FromTracesSummary, Validation, from_traces};

pub use summary::{CandidateSummary, Comparison, Lineage, RunSummary, TaskDelta};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tooltune_core::{ToolSpec, TrajectoryId};
use tooltune_evaluator::evaluate::{
    Candidate as EvalCandidate, EvalOptions, Mode, TaskResult, evaluate,
};
use tooltune_evaluator::{McpServer, Split, Suite};
use tooltune_llm::ChatModel;
use tooltune_objectives::{Metrics, Objective, RolloutFacts, per_task_scores};
use tooltune_optimizer::{Action, Budget, Config, Descriptions, Observation, Scores, Search};
use tooltune_reflection::{Goal, ReflectionOptions, ReflectionRequest, ReflectiveExample, reflect};
use tooltune_store::Store;
// This machine's name, to tell our own processes from other machines' in a shared store (the name workers report
// under too).
use tooltune_worker::work::hostname;

/// Everything that can stop a run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] tooltune_store::StoreError),
    /// The evaluator failed in a way that is not a single rollout's infrastructure failure (the suite, the
    /// server's start-up).
    #[error(transparent)]
    Eval(#[from] tooltune_evaluator::EvalError),
    /// The search refused an observation or a configuration.
    #[error(transparent)]
    Search(#[from] tooltune_optimizer::OptimizerError),
    /// A stored or computed objective fact was invalid.
    #[error(transparent)]
    Objectives(#[from] tooltune_objectives::ObjectivesError),
    /// The job queue failed (a run with workers).
    #[error(transparent)]
    Worker(#[from] tooltune_worker::WorkerError),
    /// A stop cut a wait for workers short; the run is recorded as stopped and can be resumed.
    #[error("run {run}: {message}; resume it with `tooltune optimize --resume {run}`")]
    Interrupted {
        /// The run.
        run: String,
        /// What was waiting.
        message: String,
    },
    /// The run's configuration is unusable.
    #[error("run configuration: {0}")]
    Config(String),
    /// Another process is driving the run (its lease has not expired).
    #[error(
        "run {run} is being driven by another process ({owner}, lease until {until}); wait for it, stop it, or \
         resume after the lease expires"
    )]
    Busy {
        /// The run.
        run: String,
        /// Who holds the lease.
        owner: String,
        /// When the lease expires unless renewed.
        until: String,
    },
    /// A stored JSON body did not parse (a store written by another version).
    #[error("stored {what} of run {run} is unreadable: {message}")]
    Corrupt {
        /// The run.
        run: String,
        /// What was being read.
        what: &'static str,
        /// The parse error.
        message: String,
    },
}

/// What a run is asked to do. Stored with the run, so `resume` needs nothing but the run id and the models.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// The suite file.
    pub suite: PathBuf,
    /// Tools whose descriptions are mutated (round-robin).
    pub tools: Vec<String>,
    /// The tool whose selection is measured (the first of `tools` by default).
    pub target: String,
    /// What the search maximises. Both metrics are recorded either way.
    pub objective: Objective,
    /// The search's seed.
    pub seed: u64,
    /// Rollout, token and time limits.
    pub budget: Budget,
    /// Minibatch size.
    pub minibatch: usize,
    /// Stop after this many iterations without a better best candidate.
    pub patience: Option<u32>,
    /// Stop when the best validation mean reaches this.
    pub score_threshold: Option<f64>,
    /// Rollouts per (candidate, task); more than one only makes sense with a sampling backend.
    pub rollouts_per_task: u32,
    /// Rollouts advancing together in one model batch.
    pub batch: usize,
    /// The agent model spec (for the record; the caller builds the model).
    pub agent: String,
    /// The reflector model spec.
    pub reflector: String,
    /// A file whose appearance stops the run after the current step.
    pub stop_file: Option<PathBuf>,
    /// Screen proposals with exact first-move scores before rolling them out (`None`: GEPA as published).
    #[serde(default)]
    pub screening: Option<tooltune_optimizer::Screening>,
    /// Descriptions that replace the server's own in the seed candidate (tool -> text).
    #[serde(default)]
    pub seed_overrides: BTreeMap<String, String>,
    /// Compare candidates on this many validation tasks (a fixed sample balanced across owner tools, drawn from
    /// the run's seed) instead of the whole validation split. Task-success validation is the search's largest
    /// cost (a rollout per task per accepted candidate); a smaller set buys more candidates for the same budget,
    /// at the price of a noisier choice of winner, which the held-out comparison then checks.
    #[serde(default)]
    pub validation_sample: Option<usize>,
    /// Roll out this many held-out tasks (a fixed sample balanced across owner tools, drawn from the run's seed)
    /// instead of the whole test split; the other test tasks are screened (exact first moves, no rollout). Task
    /// success is then measured on the sample and every first-move measure (selection, routing, off-target
    /// selection) on the whole split. The held-out rollouts are the largest fixed cost of a short run (a rollout
    /// per test task for the seed and again for the winner); a screen costs about a fifth of one.
    #[serde(default)]
    pub test_sample: Option<usize>,
    /// Send rollouts and screens as jobs to `tooltune worker` processes (PostgreSQL stores only) instead of
    /// playing them in this process. `None`: play them here.
    #[serde(default)]
    pub workers: Option<tooltune_worker::WorkerPolicy>,
}

/// A fixed sample of `n` of `tasks` (id, owner tool), balanced across owners: each owner's tasks are ordered by a
/// hash of the seed and their id, and the owners give one task in turn until `n` are taken. Returned in the
/// order given. All of them when `n` covers them.
pub fn stratified_sample(tasks: &[(String, Option<String>)], n: usize, seed: u64) -> Vec<String> {
    if n >= tasks.len() {
        return tasks.iter().map(|(id, _)| id.clone()).collect();
    }
    let mut groups: BTreeMap<Option<&str>, Vec<(Vec<u8>, usize)>> = BTreeMap::new();
    for (i, (id, owner)) in tasks.iter().enumerate() {
        let mut h = Sha256::new();
        h.update(seed.to_le_bytes());
        h.update(id.as_bytes());
        groups
            .entry(owner.as_deref())
            .or_default()
            .push((h.finalize().to_vec(), i));
    }
    for g in groups.values_mut() {
        g.sort();
        g.reverse();
    }
    let mut picked = Vec::with_capacity(n);
    while picked.len() < n {
        for g in groups.values_mut() {
            if picked.len() < n
                && let Some((_, i)) = g.pop()
            {
                picked.push(i);
            }
        }
    }
    picked.sort_unstable();
    picked.into_iter().map(|i| tasks[i].0.clone()).collect()
}

/// Progress, as it happens. Stored as the run's events and handed to the caller's callback.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The run began or resumed.
    Started {
        /// Run id.
        run_id: String,
        /// The objective.
        objective: String,
        /// True when resuming.
        resumed: bool,
    },
    /// A candidate is being evaluated.
    Evaluating {
        /// Candidate number.
        candidate: u32,
        /// `validation`, `minibatch`, `merge` or `test`.
        phase: String,
        /// How many tasks.
        tasks: usize,
    },
    /// A candidate was evaluated.
    Evaluated {
        /// Candidate number.
        candidate: u32,
        /// The phase.
        phase: String,
        /// Mean objective score over the tasks.
        mean: f64,
        /// Both metrics over the tasks of this evaluation (boxed: it is much larger than the other events).
        metrics: Box<Metrics>,
        /// Rollouts spent so far (as the search counts them).
        rollouts_spent: u64,
        /// Screened task evaluations spent so far (as the search counts them: a parent's screen is not counted
        /// again). Absent from events stored before screening existed.
        #[serde(default)]
        screened_spent: u64,
    },
    /// The reflector is asked for a new description.
    Reflecting {
        /// Parent candidate.
        parent: u32,
        /// Tool.
        tool: String,
    },
    /// The reflector answered.
    Proposed {
        /// Parent candidate.
        parent: u32,
        /// Tool.
        tool: String,
        /// The new description, if the reply parsed.
        description: Option<String>,
        /// The diagnosis.
        diagnosis: Option<String>,
        /// Why it failed, if it did.
        error: Option<String>,
    },
    /// The search stopped.
    Stopped {
        /// Why.
        reason: String,
    },
    /// The final comparison on the test split is done.
    Finished {
        /// The best candidate.
        best: u32,
    },
}

/// The models a run uses.
#[derive(Clone)]
pub struct Models {
    /// The agent that picks tools.
    pub agent: Arc<dyn ChatModel>,
    /// The reflector that rewrites descriptions.
    pub reflector: Arc<dyn ChatModel>,
}

/// What the caller can use to stop a run from outside (Ctrl-C, the web service's stop endpoint).
#[derive(Debug, Clone, Default)]
pub struct StopSignal(Arc<AtomicBool>);

impl StopSignal {
    /// Asks the run to stop after its current step.
    pub fn stop(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    /// Whether a stop was asked for.
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// The content address of a candidate's descriptions: rollouts of equal candidates share stored results.
pub fn candidate_key(descriptions: &Descriptions) -> String {
    let v = serde_json::to_value(descriptions).unwrap_or_default();
    format!(
        "cand-{}",
        tooltune_core::DescriptionId::of("candidate", "", &v).short()
    )
}

pub use tooltune_evaluator::host::HOST_VERSION;
use tooltune_evaluator::host::simd_path;
pub use tooltune_worker::WorkerPolicy;

/// The content address of one task's result: with greedy decoding a rollout (and an exact screen) is a pure
/// function of the world (`world`: model, host, suite, server, tools shown), the task and the rollout index; a
/// host that samples adds its seed (`None` when greedy, so runs with different search seeds share their
/// rollouts). Equal keys may share one result across candidates, runs and demos; anything that changes one of
/// these changes the key, so nothing is invalidated by hand.
pub fn rollout_key(kind: &str, world: &str, task: &str, rollout: u32, seed: Option<u64>) -> String {
    let seed = seed.map_or_else(|| "greedy".to_string(), |s| s.to_string());
    let mut h = Sha256::new();
    // Each part length-prefixed: with a separator byte, parts that contain it could run into each other.
    for part in [kind, world, task, &rollout.to_string(), &seed] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    format!("{kind}-{}", hex::encode(h.finalize()))
}

/// Task-success scores blended with each task's routing score, `(1 - weight) x success + weight x routing`, so
/// scores stay in [0, 1] as the search requires (see `Screening::tie_break`). With `weight` w, one more success
/// outweighs any routing difference over fewer than (1 - w) / w tasks (998 at the default).
pub fn tie_broken(
    mut success: BTreeMap<String, f64>,
    routing: &BTreeMap<String, f64>,
    weight: f64,
) -> BTreeMap<String, f64> {
    let w = weight.clamp(0.0, 1.0);
    for (task, v) in success.iter_mut() {
        if let Some(r) = routing.get(task) {
            *v = (1.0 - w) * *v + w * r.clamp(0.0, 1.0);
        }
    }
    success
}

/// One task's screen score under an objective (see `Ctx::screen_candidate`).
pub fn screen_value(r: &TaskResult, objective: Objective, target: &str) -> f64 {
    let played_routed =
        tooltune_objectives::routed(r.owner.as_deref(), r.called.first().map(String::as_str));
    let v = match objective {
        Objective::TaskSuccess | Objective::Routing => r
            .routing_probability
            .unwrap_or(if played_routed { 1.0 } else { 0.0 }),
        Objective::SelectionRate => r
            .first_call_probabilities
            .as_ref()
            .and_then(|p| p.get(target).copied())
            .unwrap_or(if r.target_first { 1.0 } else { 0.0 }),
    };
    v.clamp(0.0, 1.0)
}

/// Metrics of screens: first moves only, so no success figure.
pub(crate) fn screen_metrics(facts: &[RolloutFacts]) -> Metrics {
    let mut m = Metrics::from_rollouts(facts);
    m.success = tooltune_objectives::stats::Rate::empty();
    m.mean_score = None;
    m
}

/// The objective facts of evaluated tasks, with `target` as the tool whose selection is measured.
pub(crate) fn facts_of(
    results: &[TaskResult],
    target: &str,
) -> Result<Vec<RolloutFacts>, DriverError> {
    results
        .iter()
        .map(|r| {
            let f = RolloutFacts::new(
                r.task_id.clone(),
                r.owner.clone(),
                target.to_string(),
                r.success,
                r.score,
                r.called.clone(),
            )?;
            let f = match r
                .first_call_probabilities
                .as_ref()
                .and_then(|p| p.get(target))
            {
                Some(p) => f.with_first_call_probability(p.clamp(0.0, 1.0))?,
                None => f,
            };
            Ok(match r.routing_probability {
                Some(p) => f.with_routing_probability(p.clamp(0.0, 1.0))?,
                None => f,
            })
        })
        .collect()
}

struct Ctx<'a> {
    store: &'a Store,
    run_id: String,
    cfg: RunConfig,
    suite: Suite,
    server: McpServer,
    server_tools: Vec<ToolSpec>,
    /// sha256 of the suite file: part of every rollout key.
    suite_digest: String,
    models: Models,
    stop: StopSignal,
    started: Instant,
    elapsed_before_ms: u64,
    on_event: &'a (dyn Fn(&Event) + Send + Sync),
    /// The search's screened evaluations, brought up to date before each action and counted up as its screens
    /// finish, so progress events say both currencies as they happen.
    screened_spent: std::sync::atomic::AtomicU64,
    /// Set once the run has warned that rollouts called tools that may write on a server nothing resets.
    warned_order: std::sync::atomic::AtomicBool,
    /// With workers: where rollouts and screens go instead of this process's evaluator.
    dispatcher: Option<tooltune_worker::Dispatcher>,
}

impl Ctx<'_> {
    fn elapsed_ms(&self) -> u64 {
        self.elapsed_before_ms + self.started.elapsed().as_millis() as u64
    }

    async fn emit(&self, e: Event) -> Result<(), DriverError> {
        (self.on_event)(&e);
        self.store
            .push_event(&self.run_id, &serde_json::to_string(&e).unwrap_or_default())
            .await?;
        Ok(())
    }

    fn stop_requested(&self) -> bool {
        self.stop.is_set() || self.cfg.stop_file.as_ref().is_some_and(|f| f.exists())
    }

    /// Results of `descriptions` on `tasks`, running only the rollouts not already stored: first this run's own
    /// rows, then the store's result cache (a rollout is a pure function of its key, see [`rollout_key`]), and
    /// only then the evaluator. Whatever is found or played is recorded under this run too.
    async fn results(
        &self,
        descriptions: &Descriptions,
        tasks: &[String],
    ) -> Result<Vec<TaskResult>, DriverError> {
        let key = candidate_key(descriptions);
        let mut have: BTreeMap<(String, i64), TaskResult> = BTreeMap::new();
        for row in self.store.rollouts(&self.run_id, &key).await? {
            let r: TaskResult = self.parse_result(&row.result, "rollout result")?;
            have.insert((row.task_id, row.rollout), r);
        }
        let candidate = EvalCandidate {
            descriptions: descriptions.clone(),
        };
        let world = self.world_key(descriptions);
        for rollout in 0..self.cfg.rollouts_per_task {
            let mut missing: Vec<String> = tasks
                .iter()
                .filter(|t| !have.contains_key(&((*t).clone(), i64::from(rollout))))
                .cloned()
                .collect();
            if missing.is_empty() {
                continue;
            }
            let keys: Vec<String> = missing
                .iter()
                .map(|t| self.task_key("rollout", &world, t, rollout))
                .collect();
            let cached = self.store.cached_results(&keys).await?;
            let mut still = Vec::new();
            for (t, k) in missing.iter().zip(&keys) {
                match cached.get(k) {
                    Some(c) => {
                        let r: TaskResult = self.parse_result(&c.result, "cached rollout")?;
                        self.store
                            .save_rollout(
                                &self.run_id,
                                &key,
                                t,
                                i64::from(rollout),
                                &c.result,
                                c.trajectory_id.as_deref(),
                            )
                            .await?;
                        have.insert((t.clone(), i64::from(rollout)), r);
                    }
                    None => still.push(t.clone()),
                }
            }
            missing = still;
            if missing.is_empty() {
                continue;
            }
            let opts = EvalOptions {
                task_ids: missing,
                target: Some(self.cfg.target.clone()),
                mode: Mode::Full,
                batch: self.cfg.batch,
                run_id: Some(self.run_id.clone()),
                candidate_id: Some(key.clone()),
                rollout,
                host: self.host(rollout),
                ..EvalOptions::default()
            };
            let played = self.play(&candidate, &opts, &world).await?;
            for r in played {
                let json = serde_json::to_string(&r).unwrap_or_default();
                self.store
                    .save_rollout(
                        &self.run_id,
                        &key,
                        &r.task_id,
                        i64::from(rollout),
                        &json,
                        r.trajectory_id.as_deref(),
                    )
                    .await?;
                // An infrastructure failure says nothing about the candidate: it is not worth keeping.
                if r.infra_failure.is_none() {
                    self.store
                        .cache_result(
                            &self.task_key("rollout", &world, &r.task_id, rollout),
                            "rollout",
                            &json,
                            r.trajectory_id.as_deref(),
                        )
                        .await?;
                }
                // The exact first moves scored before the rollout are this candidate's screen of the task.
                if rollout == 0
                    && let Some(screen) = r.first_move_only(&self.cfg.target)
                {
                    self.store
                        .cache_result(
                            &self.task_key("screen", &world, &r.task_id, 0),
                            "screen",
                            &serde_json::to_string(&screen).unwrap_or_default(),
                            None,
                        )
                        .await?;
                }
                have.insert((r.task_id.clone(), i64::from(rollout)), r);
            }
        }
        Ok(tasks
            .iter()
            .flat_map(|t| {
                (0..self.cfg.rollouts_per_task)
                    .filter_map(|r| have.get(&(t.clone(), i64::from(r))).cloned())
                    .collect::<Vec<_>>()
            })
            .collect())
    }

    /// Exact first-move results (no rollouts) of `descriptions` on `tasks`, from the result cache where the
    /// same screen was made before (by any run), else from the evaluator in selection-only mode.
    async fn screens(
        &self,
        descriptions: &Descriptions,
        tasks: &[String],
    ) -> Result<HashMap<String, TaskResult>, DriverError> {
        let world = self.world_key(descriptions);
        let keys: Vec<String> = tasks
            .iter()
            .map(|t| self.task_key("screen", &world, t, 0))
            .collect();
        let cached = self.store.cached_results(&keys).await?;
        let mut out = HashMap::new();
        let mut missing = Vec::new();
        for (t, k) in tasks.iter().zip(&keys) {
            match cached.get(k) {
                Some(c) => {
                    out.insert(t.clone(), self.parse_result(&c.result, "cached screen")?);
                }
                None => missing.push(t.clone()),
            }
        }
        if !missing.is_empty() {
            let opts = EvalOptions {
                task_ids: missing,
                target: Some(self.cfg.target.clone()),
                mode: Mode::SelectionOnly,
                batch: self.cfg.batch,
                host: self.host(0),
                ..EvalOptions::default()
            };
            let candidate = EvalCandidate {
                descriptions: descriptions.clone(),
            };
            for r in self.play(&candidate, &opts, &world).await? {
                // Only an exact screen is a pure function of its key; a sampled one is not kept.
                if r.infra_failure.is_none()
                    && r.routing_probability.is_some()
                    && r.first_move_samples.is_none()
                {
                    self.store
                        .cache_result(
                            &self.task_key("screen", &world, &r.task_id, 0),
                            "screen",
                            &serde_json::to_string(&r).unwrap_or_default(),
                            None,
                        )
                        .await?;
                }
                out.insert(r.task_id.clone(), r);
            }
        }
        Ok(out)
    }

    /// Screens a candidate on `tasks` and reports it as an evaluation of `phase`: its screen scores under the
    /// run's objective (the exact probability of the right first move for task success and routing, since task
    /// success on these suites is mostly routing; of choosing the target first for selection). A backend that
    /// cannot score exactly gives its sampled first move as 0 or 1.
    async fn screen_candidate(
        &self,
        candidate: u32,
        phase: &str,
        descriptions: &Descriptions,
        tasks: &[String],
        rollouts_spent: u64,
        counted: bool,
    ) -> Result<Scores, DriverError> {
        self.emit(Event::Evaluating {
            candidate,
            phase: phase.to_string(),
            tasks: tasks.len(),
        })
        .await?;
        let results = self.screens(descriptions, tasks).await?;
        let ordered: Vec<TaskResult> = tasks
            .iter()
            .filter_map(|t| results.get(t).cloned())
            .collect();
        let scores: Scores = tasks
            .iter()
            .map(|t| {
                let v = results.get(t).map_or(0.0, |r| {
                    screen_value(r, self.cfg.objective, &self.cfg.target)
                });
                (t.clone(), v)
            })
            .collect();
        self.emit(Event::Evaluated {
            candidate,
            phase: phase.to_string(),
            mean: tooltune_optimizer::mean_over(&scores, tasks),
            metrics: Box::new(screen_metrics(&self.facts(&ordered)?)),
            rollouts_spent,
            screened_spent: if counted {
                self.screened_spent
                    .fetch_add(tasks.len() as u64, std::sync::atomic::Ordering::Relaxed)
                    + tasks.len() as u64
            } else {
                self.screened_spent
                    .load(std::sync::atomic::Ordering::Relaxed)
            },
        })
        .await?;
        Ok(scores)
    }

    /// Plays `opts.task_ids` with `candidate`: here through the evaluator (full rollouts stored as they finish),
    /// or, in a run with workers, as jobs keyed by their content address in `world`, whose trajectories are
    /// stored here once their results arrive (the driver is the only writer of trajectories, so a job that ran
    /// twice is stored once).
    async fn play(
        &self,
        candidate: &EvalCandidate,
        opts: &EvalOptions,
        world: &str,
    ) -> Result<Vec<TaskResult>, DriverError> {
        let Some(dispatcher) = &self.dispatcher else {
            let store = (opts.mode == Mode::Full).then_some(self.store);
            let result = evaluate(
                &self.suite,
                &self.server,
                self.models.agent.as_ref(),
                store,
                candidate,
                opts,
                |_, _| {},
            )
            .await?;
            if let Some(w) = result.order_warning()
                && !self
                    .warned_order
                    .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                tracing::warn!("{w}");
            }
            return Ok(result.tasks);
        };
        let kind = match opts.mode {
            Mode::Full => "rollout",
            Mode::SelectionOnly => "screen",
        };
        let jobs: Vec<tooltune_worker::Job> = opts
            .task_ids
            .iter()
            .map(|t| tooltune_worker::Job {
                key: self.task_key(kind, world, t, opts.rollout),
                suite: dispatcher.suite_digest().to_string(),
                model: dispatcher.model().to_string(),
                task_id: t.clone(),
                mode: opts.mode,
                descriptions: candidate.descriptions.clone(),
                target: opts
                    .target
                    .clone()
                    .unwrap_or_else(|| self.cfg.target.clone()),
                rollout: opts.rollout,
                seed: opts.host.seed,
                run_id: opts.run_id.clone(),
                candidate_id: opts.candidate_id.clone(),
                max_attempts: dispatcher.policy().max_attempts,
                call_timeout_ms: u64::try_from(opts.call_timeout.as_millis()).unwrap_or(u64::MAX),
            })
            .collect();
        let done = dispatcher.run(&jobs, &|| self.stop_requested()).await?;
        let mut results = Vec::with_capacity(done.len());
        let mut trajectories = Vec::new();
        for r in done {
            let mut result = self.parse_result(&r.result, "job result")?;
            if let Some(t) = &r.trajectory {
                let t: tooltune_core::Trajectory =
                    serde_json::from_str(t).map_err(|e| DriverError::Corrupt {
                        run: self.run_id.clone(),
                        what: "job trajectory",
                        message: e.to_string(),
                    })?;
                t.validate().map_err(|e| DriverError::Corrupt {
                    run: self.run_id.clone(),
                    what: "job trajectory",
                    message: e.to_string(),
                })?;
                // The id is the content address of what is stored here. Floats are read back exactly
                // (serde_json's `float_roundtrip`), so this is the worker's id; recomputing it keeps that true
                // whatever a worker sent.
                result.trajectory_id = Some(t.id().to_string());
                trajectories.push(t);
            }
            results.push(result);
        }
        self.store.insert(&trajectories).await?;
        Ok(results)
    }

    fn parse_result(&self, text: &str, what: &'static str) -> Result<TaskResult, DriverError> {
        serde_json::from_str(text).map_err(|e| DriverError::Corrupt {
            run: self.run_id.clone(),
            what,
            message: e.to_string(),
        })
    }

    /// The host settings of rollout `rollout`.
    fn host(&self, rollout: u32) -> tooltune_evaluator::host::HostConfig {
        tooltune_evaluator::host::HostConfig {
            seed: Some(self.cfg.seed.wrapping_add(u64::from(rollout))),
            ..Default::default()
        }
    }

    /// What every rollout of `descriptions` in this run shares: the agent model (and the SIMD path its greedy
    /// output depends on), the host and its settings, the suite file, the server, and the tools as shown.
    fn world_key(&self, descriptions: &Descriptions) -> String {
        let shown: Vec<(&str, &str, String)> = self
            .server_tools
            .iter()
            .map(|t| {
                (
                    t.name.as_str(),
                    descriptions
                        .get(&t.name)
                        .map_or(t.description.as_str(), String::as_str),
                    t.input_schema.to_string(),
                )
            })
            .collect();
        let mut h = Sha256::new();
        for part in [
            self.models.agent.id(),
            simd_path().to_string(),
            HOST_VERSION.to_string(),
            format!("{:?}", tooltune_evaluator::host::HostConfig::default()),
            self.suite_digest.clone(),
            serde_json::to_string(&self.suite.server).unwrap_or_default(),
            serde_json::to_string(&shown).unwrap_or_default(),
        ] {
            h.update(part.as_bytes());
            h.update([0u8]);
        }
        // Settings that change the agent's greedy output (a non-default thread count): added only when there are
        // some, so the keys of runs on the defaults stay as they were.
        let numerics = self.models.agent.numerics();
        if !numerics.is_empty() {
            h.update(b"numerics\0");
            h.update(numerics.as_bytes());
        }
        // The fixture's content is the server's initial state: an edited fixture is another world. (Added only
        // when there is one, so the keys of suites without a fixture stay as they were.)
        let fixture = self.suite.world_digest();
        if !fixture.is_empty() {
            h.update(b"fixture\0");
            h.update(fixture.as_bytes());
        }
        hex::encode(h.finalize())
    }

    /// The content address of one task's result in a world: see [`rollout_key`].
    fn task_key(&self, kind: &str, world: &str, task: &str, rollout: u32) -> String {
        let task_text = self
            .suite
            .tasks
            .iter()
            .find(|t| t.id == task)
            .map(|t| format!("{t:?}"))
            .unwrap_or_default();
        let host = self.host(rollout);
        let seed = (host.temperature > 0.0).then_some(host.seed).flatten();
        rollout_key(kind, world, &task_text, rollout, seed)
    }

    fn facts(&self, results: &[TaskResult]) -> Result<Vec<RolloutFacts>, DriverError> {
        facts_of(results, &self.cfg.target)
    }

    async fn evaluate_action(
        &self,
        candidate: u32,
        phase: &str,
        descriptions: &Descriptions,
        tasks: &[String],
        rollouts_spent: u64,
    ) -> Result<(Scores, u64), DriverError> {
        self.emit(Event::Evaluating {
            candidate,
            phase: phase.to_string(),
            tasks: tasks.len(),
        })
        .await?;
        let results = self.results(descriptions, tasks).await?;
        let facts = self.facts(&results)?;
        let plain: Scores = per_task_scores(self.cfg.objective, &facts);
        // Shown as measured; the search gets the tie-broken scores.
        let mean = if plain.is_empty() {
            0.0
        } else {
            plain.values().sum::<f64>() / plain.len() as f64
        };
        let scores = match self.tie_break() {
            Some(w) => tie_broken(plain, &per_task_scores(Objective::Routing, &facts), w),
            None => plain,
        };
        // Counted whether or not the result came from the store, so that a resumed run spends the same budget as
        // an uninterrupted one.
        let rollouts = tasks.len() as u64 * u64::from(self.cfg.rollouts_per_task);
        self.emit(Event::Evaluated {
            candidate,
            phase: phase.to_string(),
            mean,
            metrics: Box::new(Metrics::from_rollouts(&facts)),
            rollouts_spent: rollouts_spent + rollouts,
            screened_spent: self
                .screened_spent
                .load(std::sync::atomic::Ordering::Relaxed),
        })
        .await?;
        Ok((scores, rollouts))
    }

    /// The weight of the routing tie-break on rolled-out task success (screened loop only; GEPA as published,
    /// without screens, scores success alone).
    fn tie_break(&self) -> Option<f64> {
        self.cfg
            .screening
            .as_ref()
            .filter(|s| self.cfg.objective == Objective::TaskSuccess && s.tie_break > 0.0)
            .map(|s| s.tie_break)
    }

    /// Whether every evaluation of the search is a screen (selection and routing with screening on).
    fn decisive(&self) -> bool {
        self.cfg.screening.as_ref().is_some_and(|s| s.decisive)
    }

    /// Evaluates and turns the result into the search's observation.
    async fn observe_evaluation(
        &self,
        candidate: tooltune_optimizer::CandidateId,
        phase: &str,
        descriptions: &Descriptions,
        tasks: &[String],
        rollouts_spent: u64,
    ) -> Result<Observation, DriverError> {
        if self.decisive() {
            let scores = self
                .screen_candidate(
                    candidate.0,
                    &format!("{phase} (screen)"),
                    descriptions,
                    tasks,
                    rollouts_spent,
                    true,
                )
                .await?;
            return Ok(Observation::evaluated_by_screen(
                candidate,
                scores,
                tasks.len() as u64,
                self.elapsed_ms(),
            ));
        }
        let (scores, n) = self
            .evaluate_action(candidate.0, phase, descriptions, tasks, rollouts_spent)
            .await?;
        Ok(Observation::evaluated(
            candidate,
            scores,
            n,
            self.elapsed_ms(),
        ))
    }

    /// The reflective dataset of `parent_descriptions` on `tasks`: its rollouts' trajectories, or, when the
    /// search runs on screens alone, each task's exact first moves written up as a one-step run.
    async fn reflective_examples(
        &self,
        parent_descriptions: &Descriptions,
        tasks: &[String],
    ) -> Result<Vec<ReflectiveExample>, DriverError> {
        let mut examples = Vec::new();
        if self.decisive() {
            let screens = self.screens(parent_descriptions, tasks).await?;
            let shown = EvalCandidate {
                descriptions: parent_descriptions.clone(),
            }
            .apply(&self.server_tools)
            .map_err(DriverError::Eval)?;
            for t in tasks {
                let (Some(r), Some(task)) =
                    (screens.get(t), self.suite.tasks.iter().find(|x| &x.id == t))
                else {
                    continue;
                };
                examples.extend(screen_example(r, &task.prompt, &shown));
            }
            return Ok(examples);
        }
        let results = self.results(parent_descriptions, tasks).await?;
        for r in &results {
            let Some(id) = &r.trajectory_id else { continue };
            let Some(trajectory) = self
                .store
                .trajectory(&TrajectoryId::from_stored(id.clone()))
                .await?
            else {
                continue;
            };
            examples.push(ReflectiveExample {
                task: trajectory.task.clone(),
                owner: r.owner.clone(),
                trajectory,
                success: r.success,
                feedback: r.feedback.clone(),
            });
        }
        Ok(examples)
    }

    /// Runs reflection requests together, decoded as one batch (see [`gather`]).
    async fn reflect_wave(
        &self,
        requests: Vec<ReflectionRequest>,
    ) -> Result<Vec<tooltune_reflection::Proposal>, DriverError> {
        let gather = gather::Gather::new(self.models.reflector.as_ref(), requests.len());
        let gather = &gather;
        let runs = requests.iter().map(|req| async move {
            let r = reflect(gather, req).await;
            gather.leave().await;
            r
        });
        let mut proposals = Vec::with_capacity(requests.len());
        for r in futures::future::join_all(runs).await {
            proposals.push(match r {
                Ok(p) => p,
                // A backend failure mid-way still yields the attempts made so far: recorded as a failed proposal.
                Err(tooltune_reflection::ReflectionError::Model { partial, .. }) => *partial,
                Err(e) => return Err(DriverError::Config(e.to_string())),
            });
        }
        Ok(proposals)
    }

    /// Asks the reflector for `k` new descriptions of `tool` (the first greedy, the others sampled), decoded
    /// together. Stored under (parent, tool, minibatch, k) before the search sees them, so a resumed run gets
    /// the same proposals back.
    async fn reflect_action(
        &self,
        parent_descriptions: &Descriptions,
        parent: u32,
        tool: &str,
        current: &str,
        tasks: &[String],
        k: usize,
    ) -> Result<Vec<tooltune_reflection::Proposal>, DriverError> {
        let k = k.max(1);
        let key = if k == 1 {
            format!("c{parent}:{tool}:{}", tasks.join(","))
        } else {
            format!("c{parent}:{tool}:{}:k{k}", tasks.join(","))
        };
        if let Some(stored) = self.store.proposal(&self.run_id, &key).await? {
            let corrupt = |e: serde_json::Error| DriverError::Corrupt {
                run: self.run_id.clone(),
                what: "proposal",
                message: e.to_string(),
            };
            return if k == 1 {
                Ok(vec![serde_json::from_str(&stored).map_err(corrupt)?])
            } else {
                serde_json::from_str(&stored).map_err(corrupt)
            };
        }
        self.emit(Event::Reflecting {
            parent,
            tool: tool.to_string(),
        })
        .await?;
        let examples = self.reflective_examples(parent_descriptions, tasks).await?;
        let schema = self
            .server_tools
            .iter()
            .find(|t| t.name == tool)
            .map(|t| (*t.input_schema).clone())
            .unwrap_or_default();
        // With several proposals, each is asked once: a retry (the reply's fault named, a new reply decoded) costs
        // a decode round as long as the first, and it was paid whenever any one of the k failed, which at the
        // 1.5B's parse rate (about half) was nearly always; the screen needs only one usable proposal. Retries
        // come back, for one proposal, only when the whole first wave failed.
        let request = |i: usize, max_attempts: usize| ReflectionRequest {
            tool: tool.to_string(),
            current_description: current.to_string(),
            input_schema: schema.clone(),
            goal: match self.cfg.objective {
                Objective::TaskSuccess => Goal::TaskSuccess,
                Objective::SelectionRate => Goal::Selection,
                Objective::Routing => Goal::Routing,
            },
            examples: examples.clone(),
            options: ReflectionOptions {
                seed: self.cfg.seed.wrapping_add(1000 * i as u64),
                // The first proposal is the greedy one; the others are samples of the same prompt.
                temperature: if i == 0 { 0.0 } else { 0.8 },
                max_attempts,
                ..ReflectionOptions::default()
            },
        };
        let first_wave = if k == 1 {
            ReflectionOptions::default().max_attempts
        } else {
            1
        };
        let mut proposals = self
            .reflect_wave((0..k).map(|i| request(i, first_wave)).collect())
            .await?;
        if k > 1 && !proposals.iter().any(|p| p.succeeded()) {
            // A fresh sample (not the greedy reply again) with its retries.
            proposals.extend(
                self.reflect_wave(vec![request(k, ReflectionOptions::default().max_attempts)])
                    .await?,
            );
        }
        let stored = if k == 1 {
            serde_json::to_string(&proposals[0])
        } else {
            serde_json::to_string(&proposals)
        };
        self.store
            .save_proposal(&self.run_id, &key, &stored.unwrap_or_default())
            .await?;
        for proposal in &proposals {
            let error = (!proposal.succeeded()).then(|| proposal_error(proposal));
            self.emit(Event::Proposed {
                parent,
                tool: tool.to_string(),
                description: proposal.description.clone(),
                diagnosis: proposal.diagnosis.clone(),
                error,
            })
            .await?;
        }
        Ok(proposals)
    }

    /// Answers an [`Action::Screen`]: each candidate's screen scores on `tasks`. Counted: the proposals' task
    /// evaluations (the parent's are known from before, and in the cache).
    async fn screen_action(
        &self,
        candidates: &[(tooltune_optimizer::CandidateId, Descriptions)],
        tasks: &[String],
        rollouts_spent: u64,
    ) -> Result<Observation, DriverError> {
        let mut scores = BTreeMap::new();
        for (i, (c, d)) in candidates.iter().enumerate() {
            let phase = if i == 0 { "screen (parent)" } else { "screen" };
            let s = self
                .screen_candidate(c.0, phase, d, tasks, rollouts_spent, i > 0)
                .await?;
            scores.insert(*c, s);
        }
        let counted = (candidates.len().saturating_sub(1) * tasks.len()) as u64;
        Ok(Observation::screened(scores, counted, self.elapsed_ms()))
    }
}

/// Why a proposal gave no description.
fn proposal_error(p: &tooltune_reflection::Proposal) -> String {
    p.attempts
        .last()
        .and_then(|a| a.error.clone())
        .unwrap_or_else(|| "no usable reply".to_string())
}

/// A screened task written up as a one-step run for the reflector: the most likely first move (a call without
/// arguments, or an answer without a tool) and, as the checks' feedback, the exact probabilities of every move.
fn screen_example(r: &TaskResult, prompt: &str, shown: &[ToolSpec]) -> Option<ReflectiveExample> {
    let probs = r.first_call_probabilities.clone().unwrap_or_default();
    let no_call = r.no_call_probability.unwrap_or(0.0);
    let mut moves: Vec<String> = probs.iter().map(|(t, p)| format!("{t} {p:.2}")).collect();
    moves.push(format!("no tool {no_call:.2}"));
    let right = r.owner.clone().unwrap_or_else(|| "no tool".to_string());
    let routed =
        tooltune_objectives::routed(r.owner.as_deref(), r.called.first().map(String::as_str));
    let feedback = format!(
        "first move probabilities: {}; the right first move: {right}",
        moves.join(", ")
    );
    let step = match r.called.first() {
        Some(t) => {
            serde_json::json!({"type": "model", "tool_calls": [{"name": t, "arguments": {}}]})
        }
        None => serde_json::json!({"type": "model", "content": "(answers without a tool)"}),
    };
    let trajectory: tooltune_core::Trajectory = serde_json::from_value(serde_json::json!({
        "task": prompt,
        "tools": shown,
        "steps": [step],
        "outcome": {"success": routed, "score": if routed { 1.0 } else { 0.0 }, "feedback": feedback},
    }))
    .ok()?;
    Some(ReflectiveExample {
        task: prompt.to_string(),
        owner: r.owner.clone(),
        trajectory,
        success: routed,
        feedback,
    })
}

/// Starts a new run and drives it to the end. Returns the run id and its summary.
pub async fn start(
    store: &Store,
    cfg: RunConfig,
    models: Models,
    stop: StopSignal,
    on_event: &(dyn Fn(&Event) + Send + Sync),
) -> Result<RunSummary, DriverError> {
    let run_id = format!("run-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    store
        .create_run(
            &run_id,
            "optimize",
            Some(&cfg.suite.display().to_string()),
            cfg.objective.as_str(),
            &serde_json::to_string(&cfg).unwrap_or_default(),
        )
        .await?;
    drive(store, &run_id, cfg, None, 0, models, stop, on_event).await
}

/// Resumes a run from its last checkpoint.
pub async fn resume(
    store: &Store,
    run_id: &str,
    models: Models,
    stop: StopSignal,
    on_event: &(dyn Fn(&Event) + Send + Sync),
) -> Result<RunSummary, DriverError> {
    let row = store
        .run(run_id)
        .await?
        .ok_or_else(|| DriverError::Config(format!("no run `{run_id}` in the store")))?;
    let corrupt = |what, e: serde_json::Error| DriverError::Corrupt {
        run: run_id.to_string(),
        what,
        message: e.to_string(),
    };
    let cfg: RunConfig = serde_json::from_str(&row.config).map_err(|e| corrupt("config", e))?;
    let state: Option<Search> = match &row.state {
        Some(s) => Some(serde_json::from_str(s).map_err(|e| corrupt("search state", e))?),
        None => None,
    };
    drive(
        store,
        run_id,
        cfg,
        state,
        row.elapsed_ms.max(0) as u64,
        models,
        stop,
        on_event,
    )
    .await
}

/// The run's configuration as the search needs it.
fn search_config(cfg: &RunConfig) -> Config {
    let mut c = Config::new(cfg.tools.clone());
    c.minibatch_size = cfg.minibatch;
    c.budget = cfg.budget.clone();
    c.patience = cfg.patience;
    c.score_threshold = cfg.score_threshold;
    c.screening = cfg.screening.clone();
    c
}

#[allow(clippy::too_many_arguments)]
async fn drive(
    store: &Store,
    run_id: &str,
    cfg: RunConfig,
    state: Option<Search>,
    elapsed_before_ms: u64,
    models: Models,
    stop: StopSignal,
    on_event: &(dyn Fn(&Event) + Send + Sync),
) -> Result<RunSummary, DriverError> {
    let lease = Lease::take(store, run_id, stop.clone()).await?;
    let r = drive_leased(
        store,
        run_id,
        cfg,
        state,
        elapsed_before_ms,
        models,
        stop,
        on_event,
    )
    .await;
    lease.release().await;
    r
}

/// How long a lease lasts without renewal: long enough that a busy machine's heartbeat is never late, short
/// enough that a crashed driver's run can be resumed soon after.
const LEASE_TTL: Duration = Duration::from_secs(60);

/// This process's claim on a run, renewed in the background while the run is driven, so that `tooltune serve`
/// and a `tooltune optimize --resume` in another terminal never drive the same run at once.
struct Lease {
    store: Store,
    run_id: String,
    owner: String,
    heartbeat: tokio::task::JoinHandle<()>,
}

impl Lease {
    async fn take(store: &Store, run_id: &str, stop: StopSignal) -> Result<Lease, DriverError> {
        let owner = format!(
            "{} pid {} ({})",
            hostname(),
            std::process::id(),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        if let Err((holder, until)) = store.lease_run(run_id, &owner, LEASE_TTL).await? {
            // A holder that was a process on this machine and is gone (killed, crashed), or a cancelled driver
            // of this process, cannot renew: take the run over now rather than make `--resume` after a crash
            // wait for the lease to run out.
            let dead = holder_is_dead_here(&holder)
                && store
                    .take_over_run(run_id, &holder, &owner, LEASE_TTL)
                    .await?;
            if !dead {
                return Err(DriverError::Busy {
                    run: run_id.to_string(),
                    owner: holder,
                    until,
                });
            }
            tracing::info!(
                run = run_id,
                holder,
                "took over the lease of a process that is gone"
            );
        }
        let (s, id, o) = (store.clone(), run_id.to_string(), owner.clone());
        let heartbeat = tokio::spawn(async move {
            loop {
                tokio::time::sleep(LEASE_TTL / 3).await;
                match s.lease_run(&id, &o, LEASE_TTL).await {
                    Ok(Ok(())) => {}
                    Ok(Err((holder, _))) => {
                        // Our lease lapsed (the process was suspended) and someone else took the run: stop
                        // after the current step rather than drive it twice.
                        tracing::warn!(run = %id, holder, "lost the run's lease; stopping");
                        stop.stop();
                        return;
                    }
                    Err(e) => tracing::warn!(run = %id, "renewing the run's lease: {e}"),
                }
            }
        });
        live_leases().insert(owner.clone());
        Ok(Lease {
            store: store.clone(),
            run_id: run_id.to_string(),
            owner,
            heartbeat,
        })
    }

    async fn release(self) {
        self.heartbeat.abort();
        if let Err(e) = self.store.release_run(&self.run_id, &self.owner).await {
            tracing::warn!(run = %self.run_id, "releasing the run's lease: {e}");
        }
    }
}

impl Drop for Lease {
    /// Also runs when the driving future is cancelled (a server shutting down aborts its jobs): the heartbeat
    /// stops, and this process no longer counts the lease as alive, so a new driver here may take it over.
    fn drop(&mut self) {
        self.heartbeat.abort();
        live_leases().remove(&self.owner);
    }
}

/// The leases this process holds right now. A lease naming this process but missing here belonged to a driver
/// that was cancelled, which no `/proc` check could tell.
fn live_leases() -> std::sync::MutexGuard<'static, std::collections::HashSet<String>> {
    static LIVE: std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<String>>> =
        std::sync::OnceLock::new();
    LIVE.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether a lease holder written by [`Lease::take`] names a process on this machine that no longer exists.
/// Only decidable where `/proc` lists processes; elsewhere the lease must expire.
fn holder_is_dead_here(holder: &str) -> bool {
    let mut words = holder.split_whitespace();
    let (Some(host), Some("pid"), Some(pid)) = (words.next(), words.next(), words.next()) else {
        return false;
    };
    let Ok(pid) = pid.parse::<u32>() else {
        return false;
    };
    if host != hostname() {
        return false;
    }
    if pid == std::process::id() {
        return !live_leases().contains(holder);
    }
    std::path::Path::new("/proc/self").exists()
        && !std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[allow(clippy::too_many_arguments)]
async fn drive_leased(
    store: &Store,
    run_id: &str,
    cfg: RunConfig,
    state: Option<Search>,
    elapsed_before_ms: u64,
    models: Models,
    stop: StopSignal,
    on_event: &(dyn Fn(&Event) + Send + Sync),
) -> Result<RunSummary, DriverError> {
    let suite = Suite::load(&cfg.suite)?;
    let server = suite.connect().await?;
    // Names are checked against everything the server offers (a hidden tool must exist too), then hidden.
    let listed = server.list_tools().await?;
    suite.check_tool_names(&listed)?;
    let server_tools = suite.visible_tools(listed);
    for t in cfg.tools.iter().chain(std::iter::once(&cfg.target)) {
        if !server_tools.iter().any(|s| &s.name == t) {
            return Err(DriverError::Config(format!(
                "tool `{t}` is not on the suite's server (it has: {})",
                server_tools
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    let resumed = state.is_some();
    let suite_bytes = std::fs::read(&cfg.suite).unwrap_or_default();
    let suite_digest = hex::encode(Sha256::digest(&suite_bytes));
    let dispatcher = match &cfg.workers {
        None => None,
        Some(policy) => Some(
            tooltune_worker::Dispatcher::open(
                store,
                &models.agent.id(),
                &models.agent.numerics(),
                &tooltune_store::JobSuite {
                    digest: suite_digest.clone(),
                    name: suite.name.clone(),
                    text: String::from_utf8_lossy(&suite_bytes).into_owned(),
                    origin: cfg.suite.display().to_string(),
                    fixture_digest: suite.world_digest(),
                },
                policy.clone(),
            )
            .await?,
        ),
    };
    let ctx = Ctx {
        store,
        run_id: run_id.to_string(),
        cfg,
        suite,
        server,
        server_tools,
        suite_digest,
        models,
        stop,
        started: Instant::now(),
        elapsed_before_ms,
        on_event,
        screened_spent: Default::default(),
        warned_order: Default::default(),
        dispatcher,
    };
    let mut search = match state {
        Some(s) => s,
        None => {
            let mut seed: Descriptions = ctx
                .server_tools
                .iter()
                .map(|t| (t.name.clone(), t.description.clone()))
                .collect();
            for (tool, text) in &ctx.cfg.seed_overrides {
                if !seed.contains_key(tool) {
                    return Err(DriverError::Config(format!(
                        "seed override names tool `{tool}`, which the suite's server does not offer (it has: {})",
                        seed.keys().cloned().collect::<Vec<_>>().join(", ")
                    )));
                }
                seed.insert(tool.clone(), text.clone());
            }
            let ids = |split: Split| -> Vec<String> {
                ctx.suite.split(split).map(|t| t.id.clone()).collect()
            };
            let validation = match ctx.cfg.validation_sample {
                Some(n) => {
                    let tasks: Vec<(String, Option<String>)> = ctx
                        .suite
                        .split(Split::Validation)
                        .map(|t| (t.id.clone(), t.owner.clone()))
                        .collect();
                    stratified_sample(&tasks, n.max(1), ctx.cfg.seed)
                }
                None => ids(Split::Validation),
            };
            Search::new(
                search_config(&ctx.cfg),
                seed,
                ids(Split::Train),
                validation,
                ctx.cfg.seed,
            )?
        }
    };
    ctx.emit(Event::Started {
        run_id: run_id.to_string(),
        objective: ctx.cfg.objective.as_str().to_string(),
        resumed,
    })
    .await?;
    let outcome = step_until_stop(&ctx, &mut search).await;
    let result = match outcome {
        Ok(()) => summary::finish(&ctx, &search).await,
        Err(e) => Err(e),
    };
    ctx.server.shutdown().await;
    match result {
        Ok(summary) => {
            let status = if search.stopped() == Some(tooltune_optimizer::StopReason::StopRequested)
            {
                "stopped"
            } else {
                "finished"
            };
            store
                .finish_run(
                    run_id,
                    status,
                    Some(&serde_json::to_string(&summary).unwrap_or_default()),
                    None,
                )
                .await?;
            Ok(summary)
        }
        Err(e) => {
            // The run stays resumable: its checkpoint and stored rollouts are untouched. The search's error is
            // what the caller needs; a store that also refuses the status is logged beside it, not instead of it.
            // A stop that cut a wait for workers short is a stop, not a failure.
            let (e, status) = match e {
                DriverError::Worker(w @ tooltune_worker::WorkerError::Interrupted { .. }) => (
                    DriverError::Interrupted {
                        run: run_id.to_string(),
                        message: w.to_string(),
                    },
                    "stopped",
                ),
                e => (e, "failed"),
            };
            if let Err(store_error) = store
                .finish_run(run_id, status, None, Some(&e.to_string()))
                .await
            {
                tracing::error!(
                    run = run_id,
                    "recording the run's failure ({e}): {store_error}; the run stays `running`"
                );
            }
            Err(e)
        }
    }
}

async fn step_until_stop(ctx: &Ctx<'_>, search: &mut Search) -> Result<(), DriverError> {
    loop {
        if ctx.stop_requested() {
            search.request_stop();
        }
        let action = search.next();
        let spent = search.spent().rollouts;
        ctx.screened_spent.store(
            search.spent().screened,
            std::sync::atomic::Ordering::Relaxed,
        );
        let observation = match action {
            Action::Stop(reason) => {
                ctx.emit(Event::Stopped {
                    reason: format!("{reason:?}"),
                })
                .await?;
                ctx.store
                    .save_run_state(
                        &ctx.run_id,
                        &serde_json::to_string(&*search).unwrap_or_default(),
                        ctx.elapsed_ms() as i64,
                        "running",
                    )
                    .await?;
                return Ok(());
            }
            Action::EvaluateFull {
                candidate,
                descriptions,
                tasks,
            } => {
                ctx.observe_evaluation(candidate, "validation", &descriptions, &tasks, spent)
                    .await?
            }
            Action::EvaluateMinibatch {
                candidate,
                descriptions,
                tasks,
            } => {
                ctx.observe_evaluation(candidate, "minibatch", &descriptions, &tasks, spent)
                    .await?
            }
            Action::Merge {
                candidate,
                descriptions,
                tasks,
                ..
            } => {
                ctx.observe_evaluation(candidate, "merge", &descriptions, &tasks, spent)
                    .await?
            }
            Action::Reflect {
                parent,
                tool,
                current,
                tasks,
                proposals: k,
            } => {
                let parent_descriptions = search
                    .candidate(parent)
                    .map(|c| c.descriptions.clone())
                    .unwrap_or_default();
                let proposals = ctx
                    .reflect_action(&parent_descriptions, parent.0, &tool, &current, &tasks, k)
                    .await?;
                let tokens: u64 = proposals.iter().map(|p| p.total_tokens()).sum();
                if k <= 1 {
                    let p = proposals.into_iter().next();
                    match p {
                        Some(p) if p.description.is_some() => Observation::proposed(
                            p.description.unwrap_or_default(),
                            p.diagnosis,
                            tokens,
                            ctx.elapsed_ms(),
                        ),
                        p => Observation::proposal_failed(
                            p.as_ref()
                                .map_or_else(|| "no usable reply".into(), proposal_error),
                            tokens,
                            ctx.elapsed_ms(),
                        ),
                    }
                } else {
                    let mut usable = Vec::new();
                    let mut failures = Vec::new();
                    for p in proposals {
                        match p.description.clone() {
                            Some(d) => usable.push((d, p.diagnosis.clone())),
                            None => failures.push(proposal_error(&p)),
                        }
                    }
                    Observation::proposed_many(usable, failures, tokens, ctx.elapsed_ms())
                }
            }
            Action::Screen {
                candidates, tasks, ..
            } => ctx.screen_action(&candidates, &tasks, spent).await?,
        };
        let observation = if ctx.stop_requested() {
            observation.with_stop_requested()
        } else {
            observation
        };
        search.observe(observation)?;
        ctx.store
            .save_run_state(
                &ctx.run_id,
                &serde_json::to_string(&*search).unwrap_or_default(),
                ctx.elapsed_ms() as i64,
                "running",
            )
            .await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_validation_sample_is_fixed_by_the_seed_balanced_across_owners_and_in_suite_order() {
        let tasks: Vec<(String, Option<String>)> = (0..30)
            .map(|i| {
                let owner = match i % 3 {
                    0 => Some("search_docs".to_string()),
                    1 => Some("web_search".to_string()),
                    _ => None,
                };
                (format!("t{i:02}"), owner)
            })
            .collect();
        let a = stratified_sample(&tasks, 9, 0);
        assert_eq!(
            a,
            stratified_sample(&tasks, 9, 0),
            "the same seed, the same sample"
        );
        assert_ne!(
            a,
            stratified_sample(&tasks, 9, 1),
            "another seed, another sample"
        );
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(a, sorted, "in the suite's order");
        for owner in [Some("search_docs"), Some("web_search"), None] {
            let n = a
                .iter()
                .filter(|id| tasks.iter().any(|(t, o)| t == *id && o.as_deref() == owner))
                .count();
            assert_eq!(n, 3, "{owner:?}: {a:?}");
        }
        // A sample as large as the split is the split; an owner with few tasks gives what it has.
        assert_eq!(stratified_sample(&tasks, 30, 0).len(), 30);
        let lopsided: Vec<(String, Option<String>)> = (0..10)
            .map(|i| {
                (
                    format!("u{i}"),
                    Some(if i == 0 { "a" } else { "b" }.to_string()),
                )
            })
            .collect();
        let s = stratified_sample(&lopsided, 4, 0);
        assert_eq!(s.len(), 4);
        assert!(s.contains(&"u0".to_string()));
    }

    #[test]
    fn the_routing_tie_break_separates_equal_successes_and_never_outweighs_one() {
        let m = |v: &[(&str, f64)]| -> BTreeMap<String, f64> {
            v.iter().map(|(k, x)| (k.to_string(), *x)).collect()
        };
        let mean = |s: &BTreeMap<String, f64>| s.values().sum::<f64>() / s.len() as f64;
        let w = tooltune_optimizer::Screening::DEFAULT_TIE_BREAK;
        // Same successes on a minibatch of three: the child that routes more surely scores higher.
        let parent = tie_broken(
            m(&[("a", 1.0), ("b", 1.0), ("c", 0.0)]),
            &m(&[("a", 0.5), ("b", 0.6), ("c", 0.2)]),
            w,
        );
        let child = tie_broken(
            m(&[("a", 1.0), ("b", 1.0), ("c", 0.0)]),
            &m(&[("a", 0.7), ("b", 0.6), ("c", 0.4)]),
            w,
        );
        assert!(mean(&child) > mean(&parent));
        // One more success always wins, whatever the routing (worst case: 100 tasks at 0 against 1).
        let tasks: Vec<String> = (0..100).map(|i| format!("t{i}")).collect();
        let ones: BTreeMap<String, f64> = tasks.iter().map(|t| (t.clone(), 1.0)).collect();
        let zeros: BTreeMap<String, f64> = tasks.iter().map(|t| (t.clone(), 0.0)).collect();
        let mut better = zeros.clone();
        better.insert("t0".into(), 1.0);
        assert!(mean(&tie_broken(better, &zeros, w)) > mean(&tie_broken(zeros.clone(), &ones, w)));
        // A task without a routing score keeps its success; out-of-range probabilities are clamped; every score
        // stays in [0, 1] (the search refuses others).
        let s = tie_broken(
            m(&[("a", 1.0), ("b", 0.0), ("c", 1.0)]),
            &m(&[("b", 7.0), ("c", 1.0)]),
            w,
        );
        assert_eq!(s["a"], 1.0);
        assert!((s["b"] - w).abs() < 1e-12);
        assert!(s["c"] <= 1.0 && s["c"] > 1.0 - 1e-12, "{}", s["c"]);
    }

    #[test]
    fn a_rollout_key_changes_with_every_part_and_only_with_them() {
        let base = rollout_key("rollout", "world", "task", 0, Some(7));
        assert_eq!(base, rollout_key("rollout", "world", "task", 0, Some(7)));
        assert!(base.starts_with("rollout-") && base.len() == "rollout-".len() + 64);
        let variants = [
            rollout_key("screen", "world", "task", 0, Some(7)),
            rollout_key("rollout", "world2", "task", 0, Some(7)),
            rollout_key("rollout", "world", "task2", 0, Some(7)),
            rollout_key("rollout", "world", "task", 1, Some(7)),
            rollout_key("rollout", "world", "task", 0, Some(8)),
            // A greedy host's key has no seed in it.
            rollout_key("rollout", "world", "task", 0, None),
            // Parts are separated, so moving text from one part to the next is a different key.
            rollout_key("rollout", "worldt", "ask", 0, Some(7)),
        ];
        for (i, v) in variants.iter().enumerate() {
            assert_ne!(&base, v, "variant {i}");
            for w in &variants[i + 1..] {
                assert_ne!(v, w);
            }
        }
    }

    #[test]
    fn a_lease_holder_is_dead_only_when_it_is_our_machine_and_its_process_is_gone() {
        let here = hostname();
        // A lease this process holds is alive; one it no longer holds (a cancelled driver's) is not.
        let mine = format!("{here} pid {} (abcd1234)", std::process::id());
        live_leases().insert(mine.clone());
        assert!(!holder_is_dead_here(&mine));
        live_leases().remove(&mine);
        assert!(holder_is_dead_here(&mine));
        // A pid above the kernel's limit cannot exist.
        if std::path::Path::new("/proc/self").exists() {
            assert!(holder_is_dead_here(&format!("{here} pid 4294967294 (x)")));
        }
        // Another machine's process, or a holder we did not write, is never declared dead.
        assert!(!holder_is_dead_here(
            "some-other-machine pid 4294967294 (x)"
        ));
        assert!(!holder_is_dead_here("someone"));
        assert!(!holder_is_dead_here(""));
    }
}

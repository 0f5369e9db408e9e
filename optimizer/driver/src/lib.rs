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
mod lease;
mod play;
mod reflect;
mod scores;
mod summary;

pub use from_traces::{FromTracesConfig, FromTracesSummary, Validation, from_traces};

// The run model lives in its own crate so that the report and the dashboard can read runs without building the
// evaluator and the model; re-exported here, where callers that make runs expect it.
pub use tooltune_run::{
    CandidateSummary, Comparison, Event, Lineage, OriginKind, Phase, RunConfig, RunSummary, Status,
    TaskDelta, WorkerPolicy, candidate_key,
};

use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use tooltune_core::{ToolSpec, TrajectoryId, TrajectorySink};
use tooltune_evaluator::evaluate::{
    Candidate as EvalCandidate, EvalOptions, Mode, TaskResult, evaluate,
};
use tooltune_evaluator::{McpServer, Split, Suite};
use tooltune_llm::ChatModel;
use tooltune_objectives::{Metrics, Objective, RolloutFacts, per_task_scores};
use tooltune_optimizer::{Action, Config, Descriptions, Observation, Scores, Search};
use tooltune_reflection::{
    Goal, ReflectionOptions, ReflectionRequest, ReflectiveExample, Style, reflect,
};
use tooltune_store::{RunStatus, Store};
// This machine's name, to tell our own processes from other machines' in a shared store (the name workers report
// under too).
use lease::Lease;
use reflect::proposal_error;
use scores::{facts_of, screen_metrics};
pub use scores::{rollout_key, screen_value, stratified_sample, tie_broken};

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

pub use tooltune_evaluator::host::HOST_VERSION;
use tooltune_evaluator::host::simd_path;

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

    async fn evaluate_action(
        &self,
        candidate: u32,
        phase: Phase,
        descriptions: &Descriptions,
        tasks: &[String],
        rollouts_spent: u64,
    ) -> Result<(Scores, u64), DriverError> {
        self.emit(Event::Evaluating {
            candidate,
            phase,
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
            phase,
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
        phase: Phase,
        descriptions: &Descriptions,
        tasks: &[String],
        rollouts_spent: u64,
    ) -> Result<Observation, DriverError> {
        if self.decisive() {
            let scores = self
                .screen_candidate(
                    candidate.0,
                    phase.screened(),
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
            let phase = if i == 0 {
                Phase::ScreenParent
            } else {
                Phase::Screen
            };
            let s = self
                .screen_candidate(c.0, phase, d, tasks, rollouts_spent, i > 0)
                .await?;
            scores.insert(*c, s);
        }
        let counted = (candidates.len().saturating_sub(1) * tasks.len()) as u64;
        Ok(Observation::screened(scores, counted, self.elapsed_ms()))
    }
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
            tooltune_store::RunKind::Optimize,
            Some(&cfg.suite.display().to_string()),
            cfg.objective,
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
    // A catalog suite has no server to roll out on: only a search made of exact screens can run on it.
    if cfg.objective == Objective::TaskSuccess {
        suite.needs_server("the task-success objective")?;
    }
    if !cfg.screening.as_ref().is_some_and(|s| s.decisive) {
        suite.needs_server("a search without exact screens (--no-screen)")?;
    }
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
        objective: ctx.cfg.objective,
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
                RunStatus::Stopped
            } else {
                RunStatus::Finished
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
                    RunStatus::Stopped,
                ),
                e => (e, RunStatus::Failed),
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
                        RunStatus::Running,
                    )
                    .await?;
                return Ok(());
            }
            Action::EvaluateFull {
                candidate,
                descriptions,
                tasks,
            } => {
                ctx.observe_evaluation(candidate, Phase::VALIDATION, &descriptions, &tasks, spent)
                    .await?
            }
            Action::EvaluateMinibatch {
                candidate,
                descriptions,
                tasks,
            } => {
                ctx.observe_evaluation(
                    candidate,
                    Phase::Minibatch { screened: false },
                    &descriptions,
                    &tasks,
                    spent,
                )
                .await?
            }
            Action::Merge {
                candidate,
                descriptions,
                tasks,
                ..
            } => {
                ctx.observe_evaluation(
                    candidate,
                    Phase::Merge { screened: false },
                    &descriptions,
                    &tasks,
                    spent,
                )
                .await?
            }
            Action::Reflect {
                parent,
                tool,
                current,
                tasks,
                proposals: k,
                spread,
            } => {
                let parent_descriptions = search
                    .candidate(parent)
                    .map(|c| c.descriptions.clone())
                    .unwrap_or_default();
                let evidence = search.screen_sample().to_vec();
                // The tools the proposals rewrite, with their current texts: `tool` alone, or the spread.
                let tools: Vec<(String, String)> = if spread.is_empty() {
                    vec![(tool, current)]
                } else {
                    spread
                        .iter()
                        .map(|t| {
                            let text = parent_descriptions.get(t).cloned().unwrap_or_default();
                            (t.clone(), text)
                        })
                        .collect()
                };
                let proposals = ctx
                    .reflect_action(&parent_descriptions, parent.0, &tools, &tasks, &evidence, k)
                    .await?;
                let tokens: u64 = proposals.iter().map(|(_, p)| p.total_tokens()).sum();
                if k <= 1 && spread.is_empty() {
                    let p = proposals.into_iter().next().map(|(_, p)| p);
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
                    // Each usable proposal with its tool (all the reflected one when not spread); a failure
                    // names its tool when the reflection covered several.
                    let mut usable = Vec::new();
                    let mut failures = Vec::new();
                    for (t, p) in proposals {
                        match p.description.clone() {
                            Some(d) => usable.push((t, d, p.diagnosis.clone())),
                            None if spread.is_empty() => failures.push(proposal_error(&p)),
                            None => failures.push(format!("`{t}`: {}", proposal_error(&p))),
                        }
                    }
                    Observation::proposed_spread(usable, failures, tokens, ctx.elapsed_ms())
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
                RunStatus::Running,
            )
            .await?;
    }
}

//! What the API returns and the pages show about runs, built from the stored run (configuration, search checkpoint,
//! summary) and its events. These are the service's wire types: they depend on the library types, never the
//! reverse, and they leave out what a client must not see (a password in a model's base URL).

use crate::jobs::{JobState, Jobs, view_spec};
use crate::{AppState, WebError};
use serde::Serialize;
use tooltune_objectives::stats::Rate;
use tooltune_run::{Checkpoint, Event, Progress, RunConfig, RunSummary, validation_metrics};
use tooltune_store::{RunRow, RunStatus};

/// A run in a list.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RunBrief {
    pub id: String,
    /// The suite's file name without `.toml`.
    pub suite: Option<String>,
    pub objective: String,
    /// `queued` or `running` while a job of this server has it, else the stored status (`running` for a run that
    /// another process drives, `finished`, `failed`, `stopped`).
    pub status: String,
    /// Whether a job of this server drives it (and so it can be stopped here).
    pub in_this_server: bool,
    pub target: Option<String>,
    pub budget_rollouts: Option<u64>,
    pub agent: Option<String>,
    pub elapsed_s: f64,
    pub error: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

/// The parts of a run's configuration a person wants to see.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ConfigView {
    pub suite: String,
    pub tools: Vec<String>,
    pub target: String,
    pub objective: String,
    pub seed: u64,
    pub budget_rollouts: Option<u64>,
    pub max_reflection_tokens: Option<u64>,
    pub max_wall_ms: Option<u64>,
    pub minibatch: usize,
    pub patience: Option<u32>,
    pub score_threshold: Option<f64>,
    pub agent: String,
    pub reflector: String,
}

/// One evaluation as the events report it: the points of the score charts.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct EvalPoint {
    pub seq: i64,
    pub candidate: u32,
    pub phase: tooltune_run::Phase,
    pub rollouts_spent: u64,
    pub mean: f64,
    pub success: Rate,
    pub selection: Rate,
    pub off_target: Rate,
}

/// Everything known about one run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RunDetail {
    pub run: RunBrief,
    pub config: Option<ConfigView>,
    pub progress: Option<Progress>,
    /// The driver's summary once the run finished (the winner against the seed on the test split, lineage).
    pub result: Option<RunSummary>,
    pub evaluations: Vec<EvalPoint>,
    pub events: usize,
    pub last_event: Option<serde_json::Value>,
}

fn suite_name(path: &str) -> String {
    std::path::Path::new(path)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.to_string())
}

fn config_of(row: &RunRow) -> Option<RunConfig> {
    serde_json::from_str(&row.config).ok()
}

/// The list entry of a stored run.
pub(crate) fn brief(row: &RunRow, jobs: &Jobs) -> RunBrief {
    let cfg = config_of(row);
    let job = jobs.state(&row.id);
    let status = match (row.status, job) {
        (RunStatus::Running, Some(j)) => j.as_str().to_string(),
        (s, _) => s.to_string(),
    };
    RunBrief {
        id: row.id.clone(),
        suite: row.suite.as_deref().map(suite_name),
        objective: row.objective.to_string(),
        status,
        in_this_server: matches!(job, Some(JobState::Queued | JobState::Running)),
        target: cfg.as_ref().map(|c| c.target.clone()),
        budget_rollouts: cfg.as_ref().and_then(|c| c.budget.max_rollouts),
        agent: cfg.as_ref().map(|c| view_spec(&c.agent)),
        elapsed_s: row.elapsed_ms as f64 / 1000.0,
        error: row.error.clone(),
        created_at: row.created_at.clone(),
        updated_at: row.updated_at.clone(),
    }
}

fn config_view(c: &RunConfig) -> ConfigView {
    ConfigView {
        suite: c.suite.display().to_string(),
        tools: c.tools.clone(),
        target: c.target.clone(),
        objective: c.objective.as_str().to_string(),
        seed: c.seed,
        budget_rollouts: c.budget.max_rollouts,
        max_reflection_tokens: c.budget.max_reflection_tokens,
        max_wall_ms: c.budget.max_wall_ms,
        minibatch: c.minibatch,
        patience: c.patience,
        score_threshold: c.score_threshold,
        agent: view_spec(&c.agent),
        reflector: view_spec(&c.reflector),
    }
}

/// The evaluations among a run's events, in order.
pub(crate) fn evaluations(events: &[(i64, Event)]) -> Vec<EvalPoint> {
    events
        .iter()
        .filter_map(|(seq, e)| match e {
            Event::Evaluated {
                candidate,
                phase,
                mean,
                metrics,
                rollouts_spent,
                ..
            } => Some(EvalPoint {
                seq: *seq,
                candidate: *candidate,
                phase: *phase,
                rollouts_spent: *rollouts_spent,
                mean: *mean,
                success: metrics.success,
                selection: metrics.selection,
                off_target: metrics.off_target,
            }),
            _ => None,
        })
        .collect()
}

/// Loads everything about a run; `NotFound` when the store has no such run.
pub(crate) async fn run_detail(state: &AppState, id: &str) -> Result<RunDetail, WebError> {
    let row = state
        .store
        .run(id)
        .await?
        .ok_or_else(|| WebError::NotFound(format!("run `{id}`")))?;
    let search: Option<Checkpoint> = row.state.as_deref().and_then(|s| {
        Checkpoint::parse(s)
            .map_err(|e| tracing::warn!(run = id, "unreadable search checkpoint: {e}"))
            .ok()
    });
    let result: Option<RunSummary> = row.result.as_deref().and_then(|s| {
        serde_json::from_str(s)
            .map_err(|e| tracing::warn!(run = id, "unreadable run summary: {e}"))
            .ok()
    });
    let events = state.store.events(id, -1).await?;
    // Each stored event read once: the charts and the candidates' validation figures both come from them (an event
    // another version wrote and this one cannot read is left out of both).
    let parsed: Vec<(i64, Event)> = events
        .iter()
        .filter_map(|(seq, e)| Some((*seq, serde_json::from_str(e).ok()?)))
        .collect();
    let config = config_of(&row);
    let target = config.as_ref().map_or("", |c| c.target.as_str());
    // The dashboard measures scope claims against the schema itself (`pages::run_schemas`), so the candidates' own
    // inflation figures here are measured against the tool's name only.
    let progress = search.as_ref().map(|s| {
        s.progress(
            target,
            None,
            &validation_metrics(parsed.iter().map(|(_, e)| e)),
        )
    });
    let detail = RunDetail {
        run: brief(&row, &state.jobs),
        config: config.as_ref().map(config_view),
        progress,
        result,
        evaluations: evaluations(&parsed),
        events: events.len(),
        last_event: events
            .last()
            .and_then(|(_, e)| serde_json::from_str(e).ok()),
    };
    Ok(detail)
}

//! What the API returns and the pages show about runs, built from the stored run (configuration, search checkpoint,
//! summary) and its events. These are the service's wire types: they depend on the library types, never the
//! reverse, and they leave out what a client must not see (a password in a model's base URL).

use crate::jobs::{JobState, Jobs, view_spec};
use crate::{AppState, WebError};
use serde::Serialize;
use std::collections::BTreeMap;
use tooltune_driver::{Event, RunConfig, RunSummary};
use tooltune_objectives::stats::Rate;
use tooltune_optimizer::{CandidateStatus, Origin, Search};
use tooltune_store::RunRow;

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

/// One candidate of the search.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CandidateView {
    pub id: u32,
    pub parents: Vec<u32>,
    /// `seed`, `reflection` or `merge`.
    pub origin: String,
    /// The tool a reflection changed.
    pub tool: Option<String>,
    pub diagnosis: Option<String>,
    /// `trial`, `validating`, `in_pool`, `rejected` or `abandoned`.
    pub status: String,
    /// For a rejected candidate: its trial score and the score it had to beat.
    pub rejected: Option<(f64, f64)>,
    pub validation_mean: Option<f64>,
    pub descriptions: BTreeMap<String, String>,
    pub found_at_rollouts: Option<u64>,
    pub on_frontier: bool,
    /// Tasks of the validation split on which it has the best score (its weight in Pareto sampling).
    pub frontier_wins: u32,
    pub best: bool,
}

/// The search as of its last checkpoint.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Progress {
    pub rollouts: u64,
    pub reflection_tokens: u64,
    pub iterations: u32,
    pub reflections: u32,
    pub failed_proposals: u32,
    pub accepted: u32,
    pub rejected: u32,
    pub merges_tried: u32,
    pub best: Option<u32>,
    pub stopped: Option<String>,
    /// Frontier members, by id.
    pub frontier: Vec<u32>,
    pub candidates: Vec<CandidateView>,
}

/// One evaluation as the events report it: the points of the score charts.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct EvalPoint {
    pub seq: i64,
    pub candidate: u32,
    pub phase: String,
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
    let status = match (row.status.as_str(), job) {
        ("running", Some(j)) => j.as_str().to_string(),
        (s, _) => s.to_string(),
    };
    RunBrief {
        id: row.id.clone(),
        suite: row.suite.as_deref().map(suite_name),
        objective: row.objective.clone(),
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

fn status_name(s: &CandidateStatus) -> (String, Option<(f64, f64)>) {
    match s {
        CandidateStatus::Trial => ("trial".into(), None),
        CandidateStatus::Validating => ("validating".into(), None),
        CandidateStatus::InPool => ("in_pool".into(), None),
        CandidateStatus::Rejected { score, to_beat } => {
            ("rejected".into(), Some((*score, *to_beat)))
        }
        CandidateStatus::ScreenedOut { screen, parent } => {
            ("screened_out".into(), Some((*screen, *parent)))
        }
        CandidateStatus::Abandoned => ("abandoned".into(), None),
    }
}

/// The search's candidates, frontier and spending as of its checkpoint.
pub(crate) fn progress(search: &Search) -> Progress {
    let frontier = search.frontier();
    let best = search.best().map(|c| c.id.0);
    let candidates = search
        .candidates()
        .iter()
        .map(|c| {
            let (origin, tool, diagnosis) = match &c.origin {
                Origin::Seed => ("seed", None, None),
                Origin::Reflection { tool, diagnosis } => {
                    ("reflection", Some(tool.clone()), diagnosis.clone())
                }
                Origin::Merge { .. } => ("merge", None, None),
            };
            let (status, rejected) = status_name(&c.status);
            CandidateView {
                id: c.id.0,
                parents: c.parents.iter().map(|p| p.0).collect(),
                origin: origin.to_string(),
                tool,
                diagnosis,
                status,
                rejected,
                validation_mean: c.validation_mean,
                descriptions: c.descriptions.clone(),
                found_at_rollouts: c.found_at.as_ref().map(|p| p.rollouts),
                on_frontier: frontier.members.contains(&c.id),
                frontier_wins: frontier.wins.get(&c.id).copied().unwrap_or(0),
                best: best == Some(c.id.0),
            }
        })
        .collect();
    let spent = search.spent();
    Progress {
        rollouts: spent.rollouts,
        reflection_tokens: spent.reflection_tokens,
        iterations: spent.iterations,
        reflections: spent.reflections,
        failed_proposals: spent.failed_proposals,
        accepted: spent.accepted,
        rejected: spent.rejected,
        merges_tried: spent.merges_tried,
        best,
        stopped: search.stopped().map(|r| format!("{r:?}")),
        frontier: frontier.members.iter().map(|c| c.0).collect(),
        candidates,
    }
}

/// The evaluations among a run's events, in order.
pub(crate) fn evaluations(events: &[(i64, String)]) -> Vec<EvalPoint> {
    events
        .iter()
        .filter_map(
            |(seq, text)| match serde_json::from_str::<Event>(text).ok()? {
                Event::Evaluated {
                    candidate,
                    phase,
                    mean,
                    metrics,
                    rollouts_spent,
                    ..
                } => Some(EvalPoint {
                    seq: *seq,
                    candidate,
                    phase,
                    rollouts_spent,
                    mean,
                    success: metrics.success,
                    selection: metrics.selection,
                    off_target: metrics.off_target,
                }),
                _ => None,
            },
        )
        .collect()
}

/// Loads everything about a run; `NotFound` when the store has no such run.
pub(crate) async fn run_detail(state: &AppState, id: &str) -> Result<RunDetail, WebError> {
    let row = state
        .store
        .run(id)
        .await?
        .ok_or_else(|| WebError::NotFound(format!("run `{id}`")))?;
    let search: Option<Search> = row.state.as_deref().and_then(|s| {
        serde_json::from_str(s)
            .map_err(|e| tracing::warn!(run = id, "unreadable search checkpoint: {e}"))
            .ok()
    });
    let result: Option<RunSummary> = row.result.as_deref().and_then(|s| {
        serde_json::from_str(s)
            .map_err(|e| tracing::warn!(run = id, "unreadable run summary: {e}"))
            .ok()
    });
    let events = state.store.events(id, -1).await?;
    let detail = RunDetail {
        run: brief(&row, &state.jobs),
        config: config_of(&row).as_ref().map(config_view),
        progress: search.as_ref().map(progress),
        result,
        evaluations: evaluations(&events),
        events: events.len(),
        last_event: events
            .last()
            .and_then(|(_, e)| serde_json::from_str(e).ok()),
    };
    Ok(detail)
}

//! What an evaluation reports (a task's result, a suite's rates, where the time went) and how it is computed:
//! one rollout judged by its task's checks into a [`TaskResult`], a suite's results summarised into rates.

use super::first_moves::FirstMoves;
use super::{EvalOptions, Mode};
use crate::host::Rollout;
use crate::mcp::ToolHints;
use crate::suite::{Suite, Task};
use serde::Serialize;
use std::collections::BTreeMap;
use tooltune_core::{Links, Outcome};
use tooltune_objectives::stats::Rate;

/// The outcome of one task.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct TaskResult {
    /// The task id.
    pub task_id: String,
    /// The tool the task belongs to.
    pub owner: Option<String>,
    /// Whether the checks passed (false for selection-only evaluations and infrastructure failures).
    pub success: bool,
    /// The checks' score in [0, 1].
    pub score: f64,
    /// The checks' feedback.
    pub feedback: String,
    /// The final answer.
    pub final_answer: Option<String>,
    /// Tools called, in order (for selection-only: the sampled first call, if any).
    pub called: Vec<String>,
    /// Whether the target tool was the first call.
    pub target_first: bool,
    /// Whether the target tool was called at all.
    pub target_called: bool,
    /// Exact probability that the agent's first move is a call of each tool, when the backend scores exactly.
    /// With `no_call_probability` they sum to 1.
    pub first_call_probabilities: Option<BTreeMap<String, f64>>,
    /// Exact probability that the agent answers without calling a tool first.
    #[serde(default)]
    pub no_call_probability: Option<f64>,
    /// Exact probability that the first move is the right one: the owner tool, or no tool for a task without
    /// an owner (the routing measure).
    #[serde(default)]
    pub routing_probability: Option<f64>,
    /// Set when the server or model backend failed: the task says nothing about the candidate.
    pub infra_failure: Option<String>,
    /// The stored trajectory's id (full mode).
    pub trajectory_id: Option<String>,
    /// When the first-move probabilities are estimated, not exact: the sampled first turns they count (a
    /// backend that cannot score exactly). `None`: exact, or none.
    #[serde(default)]
    pub first_move_samples: Option<u32>,
    /// Tools the rollout called that are not declared read-only (`readOnlyHint`), in call order without
    /// repeats: calls that may have changed the server's state.
    #[serde(default)]
    pub side_effect_calls: Vec<String>,
    /// With a fixture: whether the rollout changed its copy (its digest after the rollout differs from the
    /// fixture's). `None` without a fixture.
    #[serde(default)]
    pub changed_fixture: Option<bool>,
    /// Tools that declared `readOnlyHint: true` although the rollout, which called only such tools, changed the
    /// fixture: the hint is false.
    #[serde(default)]
    pub read_only_violations: Vec<String>,
    /// Success in expectation over the first move, when it was measured (`EvalOptions::expected_success`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_success: Option<super::ExpectedSuccess>,
}

impl TaskResult {
    /// The result of a task that could not be played (its server would not start, its worker was lost each time
    /// it took it): an infrastructure failure, which says nothing about the candidate.
    pub fn infrastructure_failure(task_id: &str, owner: Option<String>, message: String) -> Self {
        TaskResult {
            task_id: task_id.to_string(),
            owner,
            success: false,
            score: 0.0,
            feedback: String::new(),
            final_answer: None,
            called: Vec::new(),
            target_first: false,
            target_called: false,
            first_call_probabilities: None,
            no_call_probability: None,
            routing_probability: None,
            infra_failure: Some(message),
            trajectory_id: None,
            first_move_samples: None,
            side_effect_calls: Vec::new(),
            changed_fixture: None,
            read_only_violations: Vec::new(),
            expected_success: None,
        }
    }
}

/// Where the time went.
#[derive(Debug, Clone, Copy, Default, Serialize, serde::Deserialize)]
pub struct Timings {
    /// Wall time of the whole evaluation, seconds.
    pub total_s: f64,
    /// Time inside model calls (generation and scoring), seconds.
    pub model_s: f64,
    /// Time inside tool calls on the server, seconds.
    pub tools_s: f64,
    /// Time writing to the store, seconds.
    pub store_s: f64,
}

impl Timings {
    /// Share of wall time spent outside the model.
    pub fn outside_model_share(&self) -> f64 {
        if self.total_s > 0.0 {
            ((self.total_s - self.model_s) / self.total_s).max(0.0)
        } else {
            0.0
        }
    }
}

/// A candidate's results on a suite.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct SuiteResult {
    /// The suite name.
    pub suite: String,
    /// The tool under study.
    pub target: String,
    /// What was measured.
    pub mode: Mode,
    /// Per task.
    pub tasks: Vec<TaskResult>,
    /// Task success over tasks without infrastructure failure (full mode).
    pub success_rate: Rate,
    /// How often the target was the first call, over all judged tasks.
    pub selection_rate: Rate,
    /// How often the target was first on tasks owned by another tool.
    pub off_target_selection: Rate,
    /// Mean exact probability that the first call picks the target, when the backend scores exactly.
    pub expected_selection: Option<f64>,
    /// Share of judged tasks whose played first move was the right one (owner first, no tool where none is
    /// needed).
    pub routing: Rate,
    /// Mean exact probability of the right first move, when the backend scores exactly; the mean of sampled
    /// estimates when it cannot (then `first_move_samples` says how many per task).
    pub expected_routing: Option<f64>,
    /// With sampled first moves: the samples per task, and a 95% interval of `expected_routing` (Wilson, over
    /// every sampled first move of every task).
    #[serde(default)]
    pub first_move_samples: Option<u32>,
    /// See `first_move_samples`.
    #[serde(default)]
    pub expected_routing_interval: Option<(f64, f64)>,
    /// Mean success in expectation over the first move (`EvalOptions::expected_success`), over every judged
    /// task; `None` unless every judged task has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_success: Option<f64>,
    /// Mean probability of the first moves not played out: the mean expectation lies in
    /// `[expected_success, expected_success + expected_success_unplayed]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_success_unplayed: Option<f64>,
    /// Tasks whose rollout hit an infrastructure failure.
    pub infra_failures: u64,
    /// Where the time went.
    pub timings: Timings,
    /// Whether every rollout ran on a fresh copy of the suite's fixture.
    #[serde(default)]
    pub fixture: bool,
    /// Tools called in some rollout that are not declared read-only. Without a fixture (or a reset command) such
    /// calls may have changed the state later rollouts saw, so results may depend on the order tasks ran in.
    #[serde(default)]
    pub side_effect_tools: Vec<String>,
    /// Tools caught writing although they declare `readOnlyHint: true` (see [`TaskResult::read_only_violations`]).
    #[serde(default)]
    pub read_only_violations: Vec<String>,
    /// The rollouts' trajectories, when `evaluate` was given no store to write them to (a worker hands them to
    /// the driver with each result instead). Not part of the result's JSON.
    #[serde(skip)]
    pub trajectories: Vec<tooltune_core::Trajectory>,
}

impl SuiteResult {
    /// The warning a user should see when rollouts may have run against a changing world: tools that may write
    /// were called and nothing reset the state between rollouts. `None` when the world stayed fixed.
    pub fn order_warning(&self) -> Option<String> {
        if self.fixture || self.side_effect_tools.is_empty() {
            return None;
        }
        Some(format!(
            "rollouts called {} (not declared read-only) on one server that is not reset between rollouts: later \
             rollouts may have seen what earlier ones wrote, so results may depend on task order. Give the suite a \
             [fixture] (or a [reset] command) to start every rollout from the same state.",
            self.side_effect_tools
                .iter()
                .map(|t| format!("`{t}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }
}

/// Verdicts of a task's checks on its fixture copy: passed, and what was found.
pub(super) type WorldChecks = Vec<(bool, String)>;

/// What a rollout did to its world, for [`judge`].
pub(super) struct World<'a> {
    /// Verdicts of the task's checks on the fixture copy.
    pub(super) checks: &'a [(bool, String)],
    /// Whether the copy changed (`None`: no fixture).
    pub(super) changed: Option<bool>,
    /// The tools' behaviour hints.
    pub(super) hints: &'a BTreeMap<String, ToolHints>,
}

pub(super) fn judge(
    task: &Task,
    rollout: Rollout,
    moves: Option<FirstMoves>,
    target: &str,
    opts: &EvalOptions,
    world: &World<'_>,
) -> (TaskResult, tooltune_core::Trajectory) {
    let mut trajectory = rollout.trajectory;
    let infra = rollout.infra_failure.map(|f| f.message);
    let check = task.check_with_world(
        trajectory.final_answer.as_deref(),
        &rollout.called,
        world.checks,
    );
    let mut side_effect_calls: Vec<String> = Vec::new();
    for c in &rollout.called {
        let may_write = world.hints.get(c).is_none_or(ToolHints::may_write);
        if may_write && !side_effect_calls.contains(c) {
            side_effect_calls.push(c.clone());
        }
    }
    // The fixture changed although every tool called claims to be read-only: those claims are false.
    let read_only_violations: Vec<String> =
        if world.changed == Some(true) && side_effect_calls.is_empty() {
            let mut v: Vec<String> = rollout.called.clone();
            v.sort();
            v.dedup();
            v
        } else {
            Vec::new()
        };
    let (success, score, feedback) = match &infra {
        Some(m) => (
            false,
            0.0,
            format!("infrastructure failure, not judged: {m}"),
        ),
        None => (check.success, check.score, check.feedback),
    };
    trajectory.outcome = Outcome {
        score: Some(score),
        success: infra.is_none().then_some(success),
        feedback: Some(feedback.clone()),
    };
    trajectory.meta.external_id = Some(task.id.clone());
    trajectory.links = Links {
        run_id: opts.run_id.clone(),
        candidate_id: opts.candidate_id.clone(),
        rollout: Some(opts.rollout),
    };
    // The server's hints for the tools shown go with the trajectory into the store, as the claims they are.
    let shown: BTreeMap<String, ToolHints> = world
        .hints
        .iter()
        .filter(|(name, _)| trajectory.tool(name).is_some())
        .map(|(name, h)| (name.clone(), *h))
        .collect();
    trajectory.tool_annotations = shown;
    let result = TaskResult {
        task_id: task.id.clone(),
        owner: task.owner.clone(),
        success,
        score,
        feedback,
        final_answer: trajectory.final_answer.clone(),
        target_first: rollout.called.first().map(String::as_str) == Some(target),
        target_called: rollout.called.iter().any(|c| c == target),
        called: rollout.called,
        no_call_probability: moves.as_ref().map(|m| m.no_call),
        routing_probability: moves.as_ref().map(|m| m.routed),
        first_call_probabilities: moves.map(|m| m.tools),
        infra_failure: infra,
        trajectory_id: Some(trajectory.id().to_string()),
        first_move_samples: None,
        side_effect_calls,
        changed_fixture: world.changed,
        read_only_violations,
        expected_success: None,
    };
    (result, trajectory)
}

pub(super) fn summarise(
    suite: &Suite,
    target: String,
    mode: Mode,
    tasks: Vec<TaskResult>,
    timings: Timings,
    fixture: bool,
) -> SuiteResult {
    let mut side_effect_tools: Vec<String> = Vec::new();
    let mut read_only_violations: Vec<String> = Vec::new();
    for t in &tasks {
        for c in &t.side_effect_calls {
            if !side_effect_tools.contains(c) {
                side_effect_tools.push(c.clone());
            }
        }
        for c in &t.read_only_violations {
            if !read_only_violations.contains(c) {
                read_only_violations.push(c.clone());
            }
        }
    }
    let judged: Vec<&TaskResult> = tasks.iter().filter(|t| t.infra_failure.is_none()).collect();
    let n = judged.len() as u64;
    let successes = judged.iter().filter(|t| t.success).count() as u64;
    let selected = judged.iter().filter(|t| t.target_first).count() as u64;
    let off: Vec<&&TaskResult> = judged
        .iter()
        .filter(|t| t.owner.as_deref().is_some_and(|o| o != target))
        .collect();
    let off_selected = off.iter().filter(|t| t.target_first).count() as u64;
    let probs: Vec<f64> = tasks
        .iter()
        .filter_map(|t| t.first_call_probabilities.as_ref()?.get(&target).copied())
        .collect();
    let routed = judged
        .iter()
        .filter(|t| {
            tooltune_objectives::routed(t.owner.as_deref(), t.called.first().map(String::as_str))
        })
        .count() as u64;
    let routing_p: Vec<f64> = tasks.iter().filter_map(|t| t.routing_probability).collect();
    // Sampled estimates: every sampled first move of every task is one trial of "the right first move".
    let samples = tasks.iter().find_map(|t| t.first_move_samples);
    let expected_routing_interval = samples.map(|_| {
        let (hits, trials) = tasks
            .iter()
            .filter_map(|t| Some((t.routing_probability?, t.first_move_samples?)))
            .fold((0u64, 0u64), |(h, n), (p, k)| {
                (h + (p * f64::from(k)).round() as u64, n + u64::from(k))
            });
        let r = Rate::wilson(hits, trials);
        (r.low, r.high)
    });
    let expected: Vec<&super::ExpectedSuccess> = judged
        .iter()
        .filter_map(|t| t.expected_success.as_ref())
        .collect();
    let complete = !expected.is_empty() && expected.len() == judged.len();
    let mean = |f: fn(&super::ExpectedSuccess) -> f64| {
        complete.then(|| expected.iter().map(|e| f(e)).sum::<f64>() / expected.len() as f64)
    };
    SuiteResult {
        expected_success: mean(|e| e.value),
        expected_success_unplayed: mean(|e| e.unplayed),
        suite: suite.name.clone(),
        target,
        mode,
        success_rate: if mode == Mode::Full {
            Rate::wilson(successes, n)
        } else {
            Rate::wilson(0, 0)
        },
        selection_rate: Rate::wilson(selected, n),
        off_target_selection: Rate::wilson(off_selected, off.len() as u64),
        expected_selection: (!probs.is_empty() && probs.len() == tasks.len())
            .then(|| probs.iter().sum::<f64>() / probs.len() as f64),
        routing: Rate::wilson(routed, n),
        expected_routing: (!routing_p.is_empty() && routing_p.len() == tasks.len())
            .then(|| routing_p.iter().sum::<f64>() / routing_p.len() as f64),
        first_move_samples: samples,
        expected_routing_interval,
        infra_failures: tasks.len() as u64 - n,
        tasks,
        timings,
        fixture,
        side_effect_tools,
        read_only_violations,
        trajectories: Vec::new(),
    }
}

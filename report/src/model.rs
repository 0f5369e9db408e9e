//! The figures of one run, built from what the store holds: the run row (its configuration, status and, once
//! finished, the driver's summary), its events, its rollouts' per-task results (for what they did to the server's
//! state), and for an unfinished run its checkpointed search state. Pure: the store is read in `lib.rs`, everything
//! here works on the rows.

use crate::secrets::{redact_spec, redact_text};
use crate::verdict::{Verdict, VerdictInput, verdict};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use tooltune_objectives::{InflationReport, Metrics, Objective, Rate};
use tooltune_run::{
    CandidateSummary, Checkpoint, Comparison, Event, OriginKind, RunConfig, RunSummary, Status,
    TrialScore, candidate_key, validation_metrics,
};
use tooltune_store::{RolloutRow, RunRow, RunStatus};

/// What the store holds about one run.
#[derive(Debug, Clone)]
pub struct RunInput {
    /// The run's row.
    pub row: RunRow,
    /// Its events, `(sequence number, JSON)`, in order.
    pub events: Vec<(i64, String)>,
    /// The target tool's input schema as the server declared it, when known (needed to measure scope claims of an
    /// unfinished run's candidates; a finished run's summary already holds the measures).
    pub schema: Option<Value>,
    /// The run's stored rollouts, each under its candidate's key (`tooltune_run::candidate_key`).
    pub rollouts: Vec<(String, RolloutRow)>,
}

/// What rollouts did, or may have done, to the server's state, from the evaluator's per-task results: calls of
/// tools the server did not declare read-only, and tools caught writing although declared read-only. Tool names
/// come from the server and are untrusted text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SideEffects {
    /// Rollouts read.
    pub rollouts: u64,
    /// Of them, rollouts that ran on a fresh copy of the suite's fixture: what they wrote reached no other rollout.
    pub on_fixture: u64,
    /// Tools not declared read-only (`readOnlyHint`), each with the number of rollouts that called it.
    pub calls: BTreeMap<String, u64>,
    /// Tools that declared `readOnlyHint: true` although a rollout that called only such tools changed its
    /// fixture copy (the hint is false), each with the number of rollouts that showed it.
    pub read_only_violations: BTreeMap<String, u64>,
}

impl SideEffects {
    /// Whether no rollout called a tool that may write and no hint was caught false.
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty() && self.read_only_violations.is_empty()
    }

    fn add(&mut self, r: &RolloutEffects) {
        self.rollouts += 1;
        self.on_fixture += u64::from(r.changed_fixture.is_some());
        for t in &r.side_effect_calls {
            *self.calls.entry(t.clone()).or_default() += 1;
        }
        for t in &r.read_only_violations {
            *self.read_only_violations.entry(t.clone()).or_default() += 1;
        }
    }
}

/// The part of the evaluator's per-task result (`TaskResult`, stored as JSON by the driver) that says what a
/// rollout did to its world. Read on its own: the report does not depend on the evaluator, and results written
/// before these fields existed read as rollouts without side effects.
#[derive(Deserialize)]
struct RolloutEffects {
    #[serde(default)]
    side_effect_calls: Vec<String>,
    #[serde(default)]
    changed_fixture: Option<bool>,
    #[serde(default)]
    read_only_violations: Vec<String>,
}

/// How the run was configured (model specs with anything that looks like a credential hidden).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Settings {
    /// The agent model spec.
    pub agent: String,
    /// The reflector model spec.
    pub reflector: String,
    /// Tools whose descriptions were mutated.
    pub tools: Vec<String>,
    /// The search's seed.
    pub seed: u64,
    /// Rollout budget, if any.
    pub max_rollouts: Option<u64>,
    /// Minibatch size.
    pub minibatch: usize,
    /// Rollouts per (candidate, task).
    pub rollouts_per_task: u32,
}

/// One validation evaluation: a point of the run's charts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IterationPoint {
    /// 1-based position in the series.
    pub iteration: usize,
    /// The candidate evaluated.
    pub candidate: u32,
    /// Rollouts spent by the end of this evaluation (the charts' x axis).
    pub rollouts_spent: u64,
    /// Mean score under the run's objective.
    pub mean: f64,
    /// Tasks in this evaluation (the rest of the validation split, for the second half of a merge's evaluation).
    pub tasks: u64,
    /// Task success with its 95% interval.
    pub success: Rate,
    /// First-call selection of the target over every task, with its 95% interval.
    pub selection: Rate,
    /// First-call selection of the target on other tools' tasks.
    pub off_target: Rate,
    /// Expected selection from exact first-call probabilities, when the backend gave them.
    pub expected_selection: Option<f64>,
    /// The right first move (the task's owner tool) as played, with its 95% interval.
    pub routing: Rate,
    /// Mean exact probability of the right first move, when the backend gave first-move probabilities.
    pub expected_routing: Option<f64>,
}

/// A description the search accepted (or the seed), with what changed from its parent and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Step {
    /// Candidate number.
    pub candidate: u32,
    /// Its parents (one for a reflection, two for a merge).
    pub parents: Vec<u32>,
    /// How it was made.
    pub origin: OriginKind,
    /// The tool a reflection rewrote.
    pub tool: Option<String>,
    /// The reflector's diagnosis.
    pub diagnosis: Option<String>,
    /// Its status in the search.
    pub status: Status,
    /// For a rejected or screened-out candidate: its score and the score it had to reach.
    pub trial: Option<TrialScore>,
    /// Whether it is an ancestor of (or is) the winner, or the best so far in an unfinished run.
    pub in_lineage: bool,
    /// Whether it is the winner (the best so far in an unfinished run).
    pub is_winner: bool,
    /// Rollouts spent when it was found.
    pub found_at_rollouts: Option<u64>,
    /// The target tool's description in it.
    pub description: String,
    /// The target tool's description in its first parent.
    pub parent_description: Option<String>,
    /// Inflation measures of `description`.
    pub inflation: InflationReport,
    /// Both metrics on the validation split.
    pub validation: Option<Metrics>,
    /// Other tools whose description differs from the first parent's.
    pub other_changes: Vec<ToolChange>,
    /// What its rollouts in this run did to the server's state.
    pub side_effects: SideEffects,
}

/// A change to a tool other than the target.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolChange {
    /// The tool.
    pub tool: String,
    /// Its description in the parent.
    pub before: String,
    /// Its description in this candidate.
    pub after: String,
}

/// One line of the table of every candidate, rejected ones included.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CandidateRow {
    /// Candidate number.
    pub id: u32,
    /// Parents.
    pub parents: Vec<u32>,
    /// How it was made.
    pub origin: OriginKind,
    /// Its status in the search.
    pub status: Status,
    /// For a rejected or screened-out candidate: its score and the score it had to reach.
    pub trial: Option<TrialScore>,
    /// Whether it passed its trial (it is, or was being, validated).
    pub accepted: bool,
    /// Mean validation score under the objective.
    pub validation_mean: Option<f64>,
    /// Target description length in characters.
    pub chars: usize,
    /// Promotional and assertive phrases in it.
    pub promotional: u32,
    /// Scope claims in it.
    pub scope: u32,
    /// What its rollouts in this run did to the server's state.
    pub side_effects: SideEffects,
}

/// One answer of the reflector.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProposalRow {
    /// The candidate reflected on.
    pub parent: u32,
    /// The tool.
    pub tool: String,
    /// The proposed description, if the reply parsed.
    pub description: Option<String>,
    /// The diagnosis.
    pub diagnosis: Option<String>,
    /// Why the reply was rejected, if it was.
    pub error: Option<String>,
}

/// Every figure of one run.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// Run id.
    pub run_id: String,
    /// Where the run stands.
    pub status: RunStatus,
    /// Whether the run has its final summary (winner and test split comparison).
    pub finished: bool,
    /// `success` or `selection`.
    pub objective: Objective,
    /// The tool whose selection is measured.
    pub target: Option<String>,
    /// The suite file.
    pub suite: Option<String>,
    /// The configuration, when readable.
    pub settings: Option<Settings>,
    /// Creation time (RFC 3339).
    pub created_at: String,
    /// Last update (RFC 3339).
    pub updated_at: String,
    /// Wall time in seconds over all sessions.
    pub elapsed_s: f64,
    /// Why it failed (credentials redacted).
    pub error: Option<String>,
    /// Why the search stopped.
    pub stop_reason: Option<String>,
    /// How many times it was resumed.
    pub resumes: usize,
    /// Rollouts the search counted.
    pub rollouts: u64,
    /// Reflection tokens spent, when known.
    pub reflection_tokens: Option<u64>,
    /// Usable proposals, all of the reflector's replies counted, and reflection seconds per usable proposal,
    /// when the run's summary has them (runs stored before it counted unusable replies show none).
    pub proposal_yield: Option<(u32, u32, Option<f64>)>,
    /// Every validation evaluation in order: the charts.
    pub series: Vec<IterationPoint>,
    /// The seed, the winner's lineage and every accepted candidate, in order of creation.
    pub steps: Vec<Step>,
    /// Every candidate.
    pub candidates: Vec<CandidateRow>,
    /// Every answer of the reflector.
    pub proposals: Vec<ProposalRow>,
    /// What all of the run's rollouts did to the server's state.
    pub side_effects: SideEffects,
    /// The winner, once finished.
    pub winner: Option<u32>,
    /// The best candidate so far, for an unfinished run.
    pub best_so_far: Option<u32>,
    /// Seed versus winner on the held-out test split, once finished.
    pub test: Option<Comparison>,
    /// Whether the winner inflated its description relative to the seed, once finished.
    pub verdict: Option<Verdict>,
    /// Events that could not be read (written by another version).
    pub unreadable_events: usize,
    /// What could not be shown and why.
    pub notes: Vec<String>,
}

impl RunReport {
    /// Builds the figures from the stored rows. Never fails: what cannot be read is left out and named in `notes`.
    pub fn build(input: RunInput) -> RunReport {
        let RunInput {
            row,
            events,
            schema,
            rollouts,
        } = input;
        let mut notes = Vec::new();
        let config: Option<RunConfig> = match serde_json::from_str(&row.config) {
            Ok(c) => Some(c),
            Err(e) => {
                notes.push(format!("the run's configuration is unreadable ({e})"));
                None
            }
        };
        let summary: Option<RunSummary> = match &row.result {
            None => None,
            Some(r) => match serde_json::from_str(r) {
                Ok(s) => Some(s),
                Err(e) => {
                    notes.push(format!("the run's final summary is unreadable ({e})"));
                    None
                }
            },
        };
        let search: Option<Checkpoint> = match (&summary, &row.state) {
            (None, Some(s)) => match Checkpoint::parse(s) {
                Ok(s) => Some(s),
                Err(e) => {
                    notes.push(format!("the run's checkpoint is unreadable ({e})"));
                    None
                }
            },
            _ => None,
        };
        let mut parsed = Vec::new();
        let mut unreadable_events = 0;
        for (_, e) in &events {
            match serde_json::from_str::<Event>(e) {
                Ok(ev) => parsed.push(ev),
                Err(_) => unreadable_events += 1,
            }
        }
        if unreadable_events > 0 {
            notes.push(format!(
                "{unreadable_events} event(s) could not be read and are left out"
            ));
        }
        let target = summary
            .as_ref()
            .map(|s| s.target.clone())
            .or_else(|| config.as_ref().map(|c| c.target.clone()));

        let series = series(&parsed);
        let resumes = parsed
            .iter()
            .filter(|e| matches!(e, Event::Started { resumed: true, .. }))
            .count();
        let proposals = parsed
            .iter()
            .filter_map(|e| match e {
                Event::Proposed {
                    parent,
                    tool,
                    description,
                    diagnosis,
                    error,
                } => Some(ProposalRow {
                    parent: *parent,
                    tool: tool.clone(),
                    description: description.clone(),
                    diagnosis: diagnosis.clone(),
                    error: error.as_deref().map(redact_text),
                }),
                _ => None,
            })
            .collect();
        let event_rollouts = parsed
            .iter()
            .filter_map(|e| match e {
                Event::Evaluated { rollouts_spent, .. } => Some(*rollouts_spent),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        let event_stop = parsed.iter().rev().find_map(|e| match e {
            Event::Stopped { reason } => Some(reason.clone()),
            _ => None,
        });

        // Every candidate in one shape, from the summary when finished, from the checkpoint otherwise.
        let (candidates, lineage, winner, best_so_far): (Vec<CandidateSummary>, Vec<u32>, _, _) =
            match (&summary, &search) {
                (Some(s), _) => (
                    s.candidates.clone(),
                    s.lineage.iter().map(|l| l.candidate).collect(),
                    Some(s.winner),
                    None,
                ),
                (None, Some(search)) => {
                    if schema.is_none() {
                        notes.push(
                            "the tool's schema was not found in the store, so scope claims of this unfinished run's \
                             candidates are measured against its name only"
                                .to_string(),
                        );
                    }
                    let target = target.clone().unwrap_or_default();
                    let cands =
                        search.candidates(&target, schema.as_ref(), &validation_metrics(&parsed));
                    let lineage = search
                        .lineage_of_best(&target)
                        .iter()
                        .map(|l| l.candidate)
                        .collect();
                    (cands, lineage, None, search.best())
                }
                (None, None) => (Vec::new(), Vec::new(), None, None),
            };
        // Side effects per candidate key, and over the whole run.
        let mut effects_by_key: BTreeMap<String, SideEffects> = BTreeMap::new();
        let mut run_effects = SideEffects::default();
        let mut unreadable_results = 0;
        for (key, r) in &rollouts {
            match serde_json::from_str::<RolloutEffects>(&r.result) {
                Ok(e) => {
                    effects_by_key.entry(key.clone()).or_default().add(&e);
                    run_effects.add(&e);
                }
                Err(_) => unreadable_results += 1,
            }
        }
        if unreadable_results > 0 {
            notes.push(format!(
                "{unreadable_results} stored rollout result(s) could not be read: their side effects are not counted"
            ));
        }
        let effects_of = |c: &CandidateSummary| {
            effects_by_key
                .get(&candidate_key(&c.descriptions))
                .cloned()
                .unwrap_or_default()
        };
        let target_name = target.clone().unwrap_or_default();
        let lineage_set: BTreeSet<u32> = lineage.iter().copied().collect();
        let leader = winner.or(best_so_far);
        let by_id: BTreeMap<u32, &CandidateSummary> =
            candidates.iter().map(|c| (c.id, c)).collect();
        let steps = candidates
            .iter()
            .filter(|c| c.id == 0 || c.status.accepted() || lineage_set.contains(&c.id))
            .map(|c| {
                let parent = c.parents.first().and_then(|p| by_id.get(p));
                let other_changes = match parent {
                    Some(p) => c
                        .descriptions
                        .iter()
                        .filter(|(tool, _)| **tool != target_name)
                        .filter_map(|(tool, after)| {
                            let before = p.descriptions.get(tool)?;
                            (before != after).then(|| ToolChange {
                                tool: tool.clone(),
                                before: before.clone(),
                                after: after.clone(),
                            })
                        })
                        .collect(),
                    None => Vec::new(),
                };
                Step {
                    candidate: c.id,
                    parents: c.parents.clone(),
                    origin: c.origin,
                    tool: c.tool.clone(),
                    diagnosis: c.diagnosis.clone(),
                    status: c.status,
                    trial: c.trial,
                    in_lineage: lineage_set.contains(&c.id),
                    is_winner: leader == Some(c.id),
                    found_at_rollouts: c.found_at_rollouts,
                    description: c
                        .descriptions
                        .get(&target_name)
                        .cloned()
                        .unwrap_or_default(),
                    parent_description: parent
                        .and_then(|p| p.descriptions.get(&target_name).cloned()),
                    inflation: c.inflation.clone(),
                    validation: c.validation.clone(),
                    other_changes,
                    side_effects: effects_of(c),
                }
            })
            .collect();
        let candidate_rows = candidates
            .iter()
            .map(|c| CandidateRow {
                id: c.id,
                parents: c.parents.clone(),
                origin: c.origin,
                status: c.status,
                trial: c.trial,
                accepted: c.status.accepted(),
                validation_mean: c.validation_mean,
                chars: c.inflation.chars,
                promotional: c.inflation.counts.promotional,
                scope: c.inflation.counts.scope,
                side_effects: effects_of(c),
            })
            .collect();
        let verdict = summary.as_ref().and_then(|s| {
            let seed = by_id.get(&0)?;
            let win = by_id.get(&s.winner)?;
            Some(verdict(VerdictInput {
                objective: s.objective,
                target: &s.target,
                winner_is_seed: s.winner == 0,
                seed: &seed.inflation,
                winner: &win.inflation,
                seed_off_target: &s.test.seed.off_target,
                winner_off_target: &s.test.winner.off_target,
                exact_off_target: match (&s.test.seed.expected, &s.test.winner.expected) {
                    (Some(a), Some(b)) => a
                        .off_target
                        .zip(b.off_target)
                        .map(|(x, y)| (x, y, s.test.off_target_p_value)),
                    _ => None,
                },
            }))
        });
        if summary.is_none() {
            notes.push(format!(
                "the run has no final summary yet (status: {}): no winner, no test-split comparison and no verdict; \
                 what is shown comes from its events{}",
                row.status,
                if search.is_some() {
                    " and its last checkpoint"
                } else {
                    ""
                }
            ));
        }
        RunReport {
            run_id: row.id.clone(),
            status: row.status,
            finished: summary.is_some(),
            objective: summary
                .as_ref()
                .map(|s| s.objective)
                .unwrap_or(row.objective),
            target,
            suite: row.suite.clone(),
            settings: config.as_ref().map(|c| Settings {
                agent: redact_spec(&c.agent),
                reflector: redact_spec(&c.reflector),
                tools: c.tools.clone(),
                seed: c.seed,
                max_rollouts: c.budget.max_rollouts,
                minibatch: c.minibatch,
                rollouts_per_task: c.rollouts_per_task,
            }),
            created_at: row.created_at.clone(),
            updated_at: row.updated_at.clone(),
            elapsed_s: summary
                .as_ref()
                .map(|s| s.wall_s)
                .unwrap_or(row.elapsed_ms.max(0) as f64 / 1000.0),
            error: row.error.as_deref().map(redact_text),
            stop_reason: summary
                .as_ref()
                .map(|s| s.stop_reason.clone())
                .or(event_stop),
            resumes,
            rollouts: summary
                .as_ref()
                .map(|s| s.spent.rollouts)
                .or_else(|| search.as_ref().map(Checkpoint::rollouts))
                .unwrap_or(event_rollouts),
            reflection_tokens: summary
                .as_ref()
                .map(|s| s.spent.reflection_tokens)
                .or_else(|| search.as_ref().map(Checkpoint::reflection_tokens)),
            proposal_yield: summary
                .as_ref()
                .filter(|s| s.spent.unusable_proposals > 0 || s.spent.reflection_ms > 0)
                .map(|s| {
                    (
                        s.spent.proposals,
                        s.spent.proposals + s.spent.unusable_proposals,
                        s.spent.seconds_per_usable_proposal(),
                    )
                }),
            series,
            steps,
            candidates: candidate_rows,
            proposals,
            side_effects: run_effects,
            winner,
            best_so_far,
            test: summary.as_ref().map(|s| s.test.clone()),
            verdict,
            unreadable_events,
            notes,
        }
    }
}

/// The validation evaluations in order. A resumed run repeats the evaluation that was in flight when it stopped
/// and finds its rollouts in the store, so the repetition carries the same candidate and the same rollout count as
/// the event before it: it is the same evaluation, shown once.
fn series(events: &[Event]) -> Vec<IterationPoint> {
    let mut out: Vec<IterationPoint> = Vec::new();
    for e in events {
        let Event::Evaluated {
            candidate,
            phase,
            mean,
            metrics,
            rollouts_spent,
            ..
        } = e
        else {
            continue;
        };
        if *phase != tooltune_run::Phase::VALIDATION {
            continue;
        }
        if out
            .last()
            .is_some_and(|p| p.candidate == *candidate && p.rollouts_spent == *rollouts_spent)
        {
            continue;
        }
        out.push(IterationPoint {
            iteration: out.len() + 1,
            candidate: *candidate,
            rollouts_spent: *rollouts_spent,
            mean: *mean,
            tasks: metrics.tasks,
            success: metrics.success,
            selection: metrics.selection,
            off_target: metrics.off_target,
            expected_selection: metrics.expected.map(|e| e.all),
            routing: metrics.routing,
            expected_routing: metrics.expected_routing,
        });
    }
    out
}

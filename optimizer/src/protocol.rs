//! The search's protocol: what it asks the driver to do ([`Action`]), what the driver tells it back
//! ([`Observation`], [`Outcome`]), why it stopped ([`StopReason`]) and what it has spent ([`Spent`]). Plain data,
//! serialised into checkpoints; the state machine that uses them is in `search.rs`.

use crate::{CandidateId, Descriptions, Scores, TaskId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
/// What the driver should do next.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "action")]
pub enum Action {
    /// Evaluate a candidate on validation tasks (the seed, an accepted child, the rest of a merge).
    EvaluateFull {
        /// The candidate.
        candidate: CandidateId,
        /// Its descriptions.
        descriptions: Descriptions,
        /// The tasks to score.
        tasks: Vec<TaskId>,
    },
    /// Evaluate a candidate on a training minibatch, keeping trajectories for reflection.
    EvaluateMinibatch {
        /// The candidate (the parent, then the child, on the same tasks).
        candidate: CandidateId,
        /// Its descriptions.
        descriptions: Descriptions,
        /// The tasks to score.
        tasks: Vec<TaskId>,
    },
    /// Ask the reflector for a new description of `tool`, from `parent`'s trajectories on `tasks`.
    Reflect {
        /// The candidate whose minibatch trajectories to reflect on.
        parent: CandidateId,
        /// The tool whose description to rewrite.
        tool: String,
        /// The parent's current description of it.
        current: String,
        /// The minibatch tasks the parent was just evaluated on.
        tasks: Vec<TaskId>,
        /// How many proposals to make (answer with [`Observation::proposed_many`] when more than one).
        #[serde(default = "one")]
        proposals: usize,
        /// The tools the proposals are spread over, `tool` first: proposal `i` rewrites
        /// `spread[proposal_tool(i, spread.len())]` ([`proposal_tool`]), and the answer says which tool each usable
        /// proposal is for ([`Observation::proposed_spread`]). Empty when every proposal rewrites `tool`.
        #[serde(default)]
        spread: Vec<String>,
    },
    /// Screen candidates: the exact first-move measure of each on each task, no rollouts. The first candidate is
    /// the parent the others were proposed from (its scores are usually known to the driver already).
    Screen {
        /// The reflection's parent.
        parent: CandidateId,
        /// The candidates to screen, the parent first, with their descriptions.
        candidates: Vec<(CandidateId, Descriptions)>,
        /// The tasks to screen them on.
        tasks: Vec<TaskId>,
    },
    /// A merged candidate was made: store it and evaluate it on `tasks` (validation tasks).
    Merge {
        /// The new candidate.
        candidate: CandidateId,
        /// First parent.
        a: CandidateId,
        /// Second parent.
        b: CandidateId,
        /// Their shared ancestor.
        ancestor: CandidateId,
        /// The merged descriptions.
        descriptions: Descriptions,
        /// Validation tasks to score it on first.
        tasks: Vec<TaskId>,
    },
    /// The search is over.
    Stop(StopReason),
}

fn one() -> usize {
    1
}

/// Which of `tools` tools proposal `i` of a spread reflection rewrites: consecutive pairs go to the same tool
/// (proposal `2j` and `2j + 1`, one of each of the driver's two prompt styles), the pairs taking the tools in turn.
/// With four proposals and two tools: the first tool, the first, the second, the second.
pub fn proposal_tool(i: usize, tools: usize) -> usize {
    (i / 2) % tools.max(1)
}

/// Why the search stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The driver asked (stop file, signal).
    StopRequested,
    /// The rollout budget is spent.
    RolloutBudget,
    /// The reflection-token budget is spent.
    TokenBudget,
    /// The screened-evaluation budget is spent.
    ScreenBudget,
    /// The wall-time budget is spent.
    WallTime,
    /// The best candidate reached the score threshold.
    ScoreThreshold,
    /// `patience` iterations in a row without a better best candidate.
    Patience,
    /// The iteration cap was reached.
    MaxIterations,
}

/// What the driver reports back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// The run's wall time so far in milliseconds, from the driver's clock.
    pub elapsed_ms: u64,
    /// The driver asks the search to stop (e.g. a stop file appeared).
    pub stop_requested: bool,
    /// The result of the pending action.
    pub outcome: Outcome,
}

/// The result of an action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum Outcome {
    /// Per-task scores of an evaluation.
    Evaluated {
        /// The candidate evaluated.
        candidate: CandidateId,
        /// Exactly the tasks asked for, each in [0, 1].
        scores: Scores,
        /// Rollouts it took (all rollouts of all tasks, including failed ones).
        rollouts: u64,
        /// Screened task evaluations it took, when the driver answered it with a screen (decisive screening).
        #[serde(default)]
        screened: u64,
    },
    /// Screen scores of the candidates a [`Action::Screen`] asked for.
    Screened {
        /// Candidate -> task -> screen score in [0, 1], for exactly the candidates and tasks asked for.
        scores: BTreeMap<CandidateId, Scores>,
        /// Screened task evaluations to count (the proposals' only: the parent's are known).
        screened: u64,
    },
    /// Several proposals from one reflection (an [`Action::Reflect`] asking for more than one).
    ProposedMany {
        /// The usable proposals: description and diagnosis.
        proposals: Vec<(String, Option<String>)>,
        /// The tool each usable proposal rewrites, in the same order, when the reflection was spread over several
        /// tools; empty when all are for the reflected tool.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tools: Vec<String>,
        /// Why each unusable reply was refused.
        failures: Vec<String>,
        /// Tokens the reflection spent.
        reflection_tokens: u64,
    },
    /// The reflector proposed a description.
    Proposed {
        /// The new description of the tool.
        description: String,
        /// The reflector's diagnosis, if any.
        diagnosis: Option<String>,
        /// Tokens the reflection spent (prompt and completion, over retries).
        reflection_tokens: u64,
    },
    /// The reflector gave no usable description (after the driver's retries).
    ProposalFailed {
        /// Why, in words.
        reason: String,
        /// Tokens the attempts spent.
        reflection_tokens: u64,
    },
}

impl Outcome {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Outcome::Evaluated { .. } => "an evaluation",
            Outcome::Screened { .. } => "a screen",
            Outcome::Proposed { .. }
            | Outcome::ProposalFailed { .. }
            | Outcome::ProposedMany { .. } => "a proposal",
        }
    }
}

impl Observation {
    /// An outcome reported at `elapsed_ms`, without a stop request.
    fn of(outcome: Outcome, elapsed_ms: u64) -> Self {
        Observation {
            elapsed_ms,
            stop_requested: false,
            outcome,
        }
    }

    /// Per-task scores of the candidate the pending evaluation asked for.
    pub fn evaluated(
        candidate: CandidateId,
        scores: Scores,
        rollouts: u64,
        elapsed_ms: u64,
    ) -> Self {
        Observation::of(
            Outcome::Evaluated {
                candidate,
                scores,
                rollouts,
                screened: 0,
            },
            elapsed_ms,
        )
    }

    /// Per-task scores of an evaluation answered by a screen (decisive screening): no rollouts.
    pub fn evaluated_by_screen(
        candidate: CandidateId,
        scores: Scores,
        screened: u64,
        elapsed_ms: u64,
    ) -> Self {
        Observation::of(
            Outcome::Evaluated {
                candidate,
                scores,
                rollouts: 0,
                screened,
            },
            elapsed_ms,
        )
    }

    /// The screen scores a pending [`Action::Screen`] asked for.
    pub fn screened(scores: BTreeMap<CandidateId, Scores>, screened: u64, elapsed_ms: u64) -> Self {
        Observation::of(Outcome::Screened { scores, screened }, elapsed_ms)
    }

    /// The proposals of a reflection that asked for several.
    pub fn proposed_many(
        proposals: Vec<(String, Option<String>)>,
        failures: Vec<String>,
        reflection_tokens: u64,
        elapsed_ms: u64,
    ) -> Self {
        Observation::of(
            Outcome::ProposedMany {
                proposals,
                tools: Vec::new(),
                failures,
                reflection_tokens,
            },
            elapsed_ms,
        )
    }

    /// The proposals of a reflection spread over several tools (an [`Action::Reflect`] with a `spread`): each
    /// usable one as (tool, description, diagnosis).
    pub fn proposed_spread(
        proposals: Vec<(String, String, Option<String>)>,
        failures: Vec<String>,
        reflection_tokens: u64,
        elapsed_ms: u64,
    ) -> Self {
        let (tools, proposals) = proposals
            .into_iter()
            .map(|(tool, d, why)| (tool, (d, why)))
            .unzip();
        Observation::of(
            Outcome::ProposedMany {
                proposals,
                tools,
                failures,
                reflection_tokens,
            },
            elapsed_ms,
        )
    }

    /// A proposed description.
    pub fn proposed(
        description: String,
        diagnosis: Option<String>,
        reflection_tokens: u64,
        elapsed_ms: u64,
    ) -> Self {
        Observation::of(
            Outcome::Proposed {
                description,
                diagnosis,
                reflection_tokens,
            },
            elapsed_ms,
        )
    }

    /// A reflection that produced nothing usable.
    pub fn proposal_failed(reason: String, reflection_tokens: u64, elapsed_ms: u64) -> Self {
        Observation::of(
            Outcome::ProposalFailed {
                reason,
                reflection_tokens,
            },
            elapsed_ms,
        )
    }

    /// The same observation, also asking the search to stop.
    pub fn with_stop_requested(mut self) -> Self {
        self.stop_requested = true;
        self
    }
}

/// What the run has spent and done so far. A counter missing from stored JSON reads as 0 (run summaries written
/// before they carried all of these).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Spent {
    /// Rollouts over all evaluations.
    pub rollouts: u64,
    /// Reflection tokens, including failed proposals.
    pub reflection_tokens: u64,
    /// Wall time as last reported.
    pub elapsed_ms: u64,
    /// Completed iterations (reflections or merge attempts).
    pub iterations: u32,
    /// Iterations in a row without a better best candidate.
    pub since_improvement: u32,
    /// Reflections asked for.
    pub reflections: u32,
    /// Reflections that gave no new description.
    pub failed_proposals: u32,
    /// Iterations skipped because the parent was perfect on the minibatch.
    pub skipped_perfect: u32,
    /// Children accepted on their minibatch.
    pub accepted: u32,
    /// Children rejected on their minibatch.
    pub rejected: u32,
    /// Merges attempted.
    pub merges_tried: u32,
    /// Merges that passed their subsample.
    pub merges_accepted: u32,
    /// Screened task evaluations (exact first-move scores, no rollout).
    #[serde(default)]
    pub screened: u64,
    /// Proposals made (usable replies of the reflector).
    #[serde(default)]
    pub proposals: u32,
    /// Proposals screened out before any rollout.
    #[serde(default)]
    pub screened_out: u32,
    /// Replies of the reflector that gave no usable description: none after its retries, empty, unchanged, or
    /// the same as another proposal of the reflection. With `proposals`, the usable share.
    #[serde(default)]
    pub unusable_proposals: u32,
    /// Wall time from asking for proposals to having them (reflective examples, prompts and decoding), summed.
    #[serde(default)]
    pub reflection_ms: u64,
}

impl Spent {
    /// The share of the reflector's replies that gave a usable description, once there was one.
    pub fn usable_share(&self) -> Option<f64> {
        let all = self.proposals + self.unusable_proposals;
        (all > 0).then(|| f64::from(self.proposals) / f64::from(all))
    }

    /// Seconds of reflection per usable proposal, once there was one.
    pub fn seconds_per_usable_proposal(&self) -> Option<f64> {
        (self.proposals > 0).then(|| self.reflection_ms as f64 / 1000.0 / f64::from(self.proposals))
    }
}

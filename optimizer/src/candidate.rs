//! Candidates (a description per tool, with parentage and origin) and the records the search keeps about them.

use crate::{CandidateId, Descriptions, Scores, TaskId};
use serde::{Deserialize, Serialize};

/// How a candidate came to be.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Origin {
    /// The server's current descriptions.
    Seed,
    /// The reflector rewrote one tool's description of the parent.
    Reflection {
        /// The tool whose description changed.
        tool: String,
        /// The reflector's diagnosis, if it gave one.
        diagnosis: Option<String>,
    },
    /// Tool-by-tool combination of two candidates that share an ancestor.
    Merge {
        /// The shared ancestor the two changed from.
        ancestor: CandidateId,
        /// Tools whose description came from the first parent (changed there only, or the better parent's when
        /// both changed).
        from_a: Vec<String>,
        /// Tools whose description came from the second parent.
        from_b: Vec<String>,
    },
}

/// Where a candidate stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum CandidateStatus {
    /// Being tried on a minibatch (reflection) or a validation subsample (merge).
    Trial,
    /// Passed its trial; being evaluated on the rest of the validation split.
    Validating,
    /// Fully validated: part of the pool the frontier and the best are chosen from.
    InPool,
    /// Did not beat its parent(s) on the trial tasks.
    Rejected {
        /// Its sum over the trial tasks.
        score: f64,
        /// The sum it had to beat (reflection) or match (merge).
        to_beat: f64,
    },
    /// Screened out: another proposal of the same reflection screened better, or (task success) its screen fell
    /// more than the margin behind its parent's.
    ScreenedOut {
        /// Its mean screen score.
        screen: f64,
        /// Its parent's mean screen score on the same tasks.
        parent: f64,
    },
    /// The run stopped before its evaluation finished.
    Abandoned,
}

/// A reflection child's minibatch trial against its parent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MinibatchTrial {
    /// The training tasks both were scored on.
    pub tasks: Vec<TaskId>,
    /// The parent's scores on them.
    pub parent_scores: Scores,
    /// The child's scores on them, once evaluated.
    pub child_scores: Option<Scores>,
}

/// What the run had spent when something happened (for "rollouts and wall time to reach the best score").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// Rollouts so far.
    pub rollouts: u64,
    /// Reflection tokens so far.
    pub reflection_tokens: u64,
    /// Wall time so far, as last reported by the driver.
    pub elapsed_ms: u64,
    /// Completed iterations so far.
    pub iteration: u32,
    /// Screened task evaluations so far.
    #[serde(default)]
    pub screened: u64,
}

/// One candidate: a full set of descriptions (one per tool in the seed), its parents and what is known about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// Its number (order of creation).
    pub id: CandidateId,
    /// Tool name -> description.
    pub descriptions: Descriptions,
    /// One parent for a reflection, two for a merge, none for the seed.
    pub parents: Vec<CandidateId>,
    /// How it was made.
    pub origin: Origin,
    /// Where it stands.
    pub status: CandidateStatus,
    /// Validation scores gathered so far (complete once in the pool).
    pub validation: Scores,
    /// Mean validation score, set when it joins the pool.
    pub validation_mean: Option<f64>,
    /// The minibatch trial, for a reflection child.
    pub minibatch: Option<MinibatchTrial>,
    /// Spending when it joined the pool.
    pub found_at: Option<Progress>,
    /// Screen scores (exact first-move measure under the objective) on the tasks it was screened on.
    #[serde(default, skip_serializing_if = "Scores::is_empty")]
    pub screen: Scores,
}

/// A reflection that produced no candidate: the reply did not parse, or it repeated the current description.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailedProposal {
    /// The iteration it happened in (0-based).
    pub iteration: u32,
    /// The parent whose description was to be rewritten.
    pub parent: CandidateId,
    /// The tool.
    pub tool: String,
    /// Why: the driver's reason for a failed reply, or "unchanged" / "empty".
    pub reason: String,
}

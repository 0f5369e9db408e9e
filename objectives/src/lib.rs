//! Objectives, inflation measures and statistics for tooltune. Pure code: no IO, no clock, no global randomness
//! (the one Monte Carlo test takes its seed from the caller).
//!
//! - [`objective`]: what a run optimises ([`Objective`]), the facts of one rollout the evaluator hands over
//!   ([`RolloutFacts`]), per-task score vectors and the [`Metrics`] every run records (task success, selection of
//!   the tool under study, on- and off-target selection, each with a 95% interval).
//! - [`inflation`]: how inflated a description is: length, promotional and assertive phrases, scope claimed beyond
//!   the tool's schema, each finding with its byte span.
//! - [`stats`]: Wilson intervals, the exact McNemar test and a paired sign-flip permutation test.

pub mod inflation;
pub mod objective;
pub mod stats;

pub use inflation::{Finding, FindingKind, InflationCounts, InflationReport};
pub use objective::{ExpectedSelection, Metrics, Objective, RolloutFacts, per_task_scores, routed};
pub use stats::{
    MonteCarlo, PairedPermutation, PermutationMethod, Rate, mcnemar_exact, paired_permutation,
};

/// Everything that can go wrong in this crate: bad input, named by the field and task it came from.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ObjectivesError {
    /// An objective name that is neither `success` nor `selection`.
    #[error("unknown objective {0:?}: expected \"success\" or \"selection\"")]
    UnknownObjective(String),
    /// A rollout without a task id.
    #[error("rollout facts: `task_id` is empty")]
    EmptyTaskId,
    /// A rollout without a tool under study.
    #[error("rollout facts for task {task_id:?}: `target` (the tool under study) is empty")]
    EmptyTarget {
        /// The task of the rollout.
        task_id: String,
    },
    /// A score outside [0, 1] or not a number.
    #[error("rollout facts for task {task_id:?}: `score` {score} is not in [0, 1]")]
    ScoreOutOfRange {
        /// The task of the rollout.
        task_id: String,
        /// The offending value.
        score: f64,
    },
    /// A probability outside [0, 1] or not a number.
    #[error("rollout facts for task {task_id:?}: `p_first_target` {p} is not in [0, 1]")]
    ProbabilityOutOfRange {
        /// The task of the rollout.
        task_id: String,
        /// The offending value.
        p: f64,
    },
    /// A paired test was given a score that is not a finite number.
    #[error("paired permutation test: pair {index} holds a non-finite score ({a}, {b})")]
    NonFiniteScore {
        /// Zero-based position of the pair.
        index: usize,
        /// First candidate's score.
        a: f64,
        /// Second candidate's score.
        b: f64,
    },
    /// A Monte Carlo test asked for no permutations.
    #[error("paired permutation test: `permutations` must be at least 1")]
    NoPermutations,
}

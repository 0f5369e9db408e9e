//! The GEPA search over tool descriptions, as a pure, deterministic state machine: no IO, no clock, no threads,
//! randomness only from a ChaCha8 generator seeded by the caller and saved with the state.
//!
//! # Protocol (for the driver)
//!
//! The driver (async, does the IO) owns a [`Search`] and steps it:
//!
//! ```text
//! let mut search = Search::new(config, seed_descriptions, train_tasks, validation_tasks, seed)?;
//! loop {
//!     match search.next() {
//!         Action::EvaluateFull { candidate, descriptions, tasks }
//!         | Action::EvaluateMinibatch { candidate, descriptions, tasks } => {
//!             // Run every task in `tasks` with `descriptions` (keep the trajectories: a Reflect may follow),
//!             // score each task under the objective (mean over rollouts), then:
//!             search.observe(Observation::evaluated(candidate, per_task_scores, rollouts, elapsed_ms))?;
//!         }
//!         Action::Reflect { parent, tool, current, tasks } => {
//!             // Build the reflective dataset from `parent`'s trajectories on `tasks` (the minibatch it was just
//!             // evaluated on), ask the reflector for a new description of `tool` (currently `current`), then:
//!             search.observe(Observation::proposed(text, diagnosis, tokens, elapsed_ms))?;
//!             // or, when the reply did not parse after retries:
//!             search.observe(Observation::proposal_failed(reason, tokens, elapsed_ms))?;
//!         }
//!         Action::Reflect { proposals: k, spread, .. } if k > 1 => {
//!             // With screening on: k proposals from one reflection, the unusable replies as failures.
//!             search.observe(Observation::proposed_many(usable, failures, tokens, elapsed_ms))?;
//!             // With a non-empty `spread` (several tools under study), proposal i rewrites
//!             // spread[proposal_tool(i, spread.len())], and each usable one is answered with its tool:
//!             search.observe(Observation::proposed_spread(usable_with_tools, failures, tokens, elapsed_ms))?;
//!         }
//!         Action::Screen { parent, candidates, tasks } => {
//!             // The exact first-move measure of every candidate (the parent first) on every task, no rollouts:
//!             search.observe(Observation::screened(scores_by_candidate, proposals_times_tasks, elapsed_ms))?;
//!         }
//!         Action::Merge { candidate, descriptions, tasks, .. } => {
//!             // A new candidate combining two lineages: store it, evaluate it on `tasks` (validation tasks),
//!             search.observe(Observation::evaluated(candidate, per_task_scores, rollouts, elapsed_ms))?;
//!         }
//!         Action::Stop(reason) => break,
//!     }
//!     persist(serde_json::to_string(&search)?); // optional, after every observe: the state is the checkpoint
//! }
//! let winner = search.best();
//! ```
//!
//! Rules the driver relies on:
//! - Every action except `Stop` must be answered by exactly one `observe`. Calling `next` again before answering
//!   returns the same action (so after a crash, deserialise the last state and call `next`: it repeats the action
//!   that was in flight, whose finished rollouts the driver can take from its store).
//! - An evaluation must score exactly the tasks asked for, each in [0, 1]; a failed rollout is a score, not an
//!   absence. A wrong answer is an [`OptimizerError`] and leaves the state unchanged.
//! - `elapsed_ms` is the run's wall time so far, measured by the driver (resumed runs add the time before the
//!   crash); `Observation::stop_requested` (or [`Search::request_stop`]) asks for a stop, e.g. when a stop file
//!   appears. The search never reads a clock.
//! - The same seed and the same observations give the same actions.
//!
//! # What a step does (GEPA, Agrawal et al. 2025)
//!
//! 1. The seed candidate (the server's current descriptions) is evaluated on the validation split.
//! 2. Each iteration either merges or reflects. **Reflection:** pick a parent from the per-task Pareto frontier
//!    of validation scores ([`Frontier`]), sample a minibatch of training tasks (epoch-shuffled, default 3),
//!    evaluate the parent on it; if it is already perfect there, skip; otherwise ask for a new description of the
//!    next tool in round-robin order (with screening and several tools, the proposals are spread over the tools
//!    from that one on, and the screen picks among them), evaluate the child on the same minibatch, and accept it only if its
//!    minibatch sum is strictly higher; an accepted child is evaluated on the whole validation split and joins the
//!    pool. **Merge** (after an accepted reflection, at most `max_merges` times): two frontier members that share
//!    an ancestor and changed different tools are combined tool by tool; the merge is evaluated on a few validation
//!    tasks where the parents differ and kept if it scores at least as well there as the better parent, then on
//!    the rest of the validation split.
//! 3. Before each new action the hard limits are checked (stop request, wall time, rollouts, reflection tokens):
//!    an overshoot is at most one action. Between iterations also the score threshold, patience (iterations
//!    without a better best candidate) and the iteration cap.
//!
//! The best candidate is the one with the highest mean validation score (ties: the earlier one).

mod candidate;
mod config;
mod merge;
pub mod pareto;
mod protocol;
mod search;

pub use candidate::{Candidate, CandidateStatus, FailedProposal, MinibatchTrial, Origin, Progress};
pub use config::{Budget, Config, Screening};
pub use pareto::Frontier;
pub use protocol::{Action, Observation, Outcome, Spent, StopReason, proposal_tool};
pub use search::{Search, mean_over, pick_best};

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// A task id of the suite.
pub type TaskId = String;
/// Tool name -> description text: what a candidate is.
pub type Descriptions = BTreeMap<String, String>;
/// Task id -> score in [0, 1] (mean over rollouts) under the run's objective.
pub type Scores = BTreeMap<TaskId, f64>;

/// A candidate's number in the search, in order of creation (the seed is 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CandidateId(pub u32);

impl fmt::Display for CandidateId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "c{}", self.0)
    }
}

/// Everything the search can refuse: a configuration it cannot run, or an observation that does not answer the
/// pending action. An error leaves the search state unchanged.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum OptimizerError {
    /// A configuration field is out of range.
    #[error("optimizer config: `{field}` {reason}")]
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A tool under study is missing from the seed descriptions.
    #[error("optimizer config: tool {tool:?} in `tools` has no description in the seed candidate")]
    UnknownTool {
        /// The tool.
        tool: String,
    },
    /// A task split is empty or repeats a task.
    #[error("optimizer tasks: the {split} split {reason}")]
    InvalidTasks {
        /// `train` or `validation`.
        split: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// `observe` was called with no action waiting for an answer (before `next`, or after a stop).
    #[error(
        "observation received but no action is waiting for one (call `next` first; the search may have stopped)"
    )]
    NothingPending,
    /// The observation is of the wrong kind for the pending action.
    #[error("observation is {got}, but the pending action expects {expected}")]
    UnexpectedOutcome {
        /// What the pending action expects.
        expected: &'static str,
        /// What was received.
        got: &'static str,
    },
    /// A spread reflection's answer names a tool the reflection was not asked about, or does not name one for
    /// every proposal.
    #[error(
        "proposals for tools {got:?}, but the pending reflection asked for proposals for {asked:?}"
    )]
    WrongProposalTools {
        /// The tools the reflection was spread over.
        asked: Vec<String>,
        /// The tools the answer names, one a proposal.
        got: Vec<String>,
    },
    /// An evaluation of another candidate than the one asked for.
    #[error("evaluation of candidate {got}, but the pending action evaluates {expected}")]
    WrongCandidate {
        /// The candidate asked for.
        expected: CandidateId,
        /// The candidate received.
        got: CandidateId,
    },
    /// An evaluation lacks a task it was asked for.
    #[error("evaluation of candidate {candidate} has no score for task {task:?}")]
    MissingScore {
        /// The candidate.
        candidate: CandidateId,
        /// The task.
        task: TaskId,
    },
    /// An evaluation scores a task it was not asked for.
    #[error("evaluation of candidate {candidate} scores task {task:?}, which was not asked for")]
    UnexpectedTask {
        /// The candidate.
        candidate: CandidateId,
        /// The task.
        task: TaskId,
    },
    /// A score outside [0, 1] or not a number.
    #[error(
        "evaluation of candidate {candidate}: score {score} for task {task:?} is not in [0, 1]"
    )]
    InvalidScore {
        /// The candidate.
        candidate: CandidateId,
        /// The task.
        task: TaskId,
        /// The value.
        score: f64,
    },
}

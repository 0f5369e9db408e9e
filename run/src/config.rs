//! What a run is asked to do: stored with the run, so that a resumed run, a worker or a report needs nothing but the
//! run's row.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use tooltune_objectives::Objective;
use tooltune_optimizer::Budget;

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
    pub workers: Option<WorkerPolicy>,
}

/// How a run uses workers. Stored with the run's configuration, so a resumed run uses them too.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerPolicy {
    /// How many times a job may be taken (its worker killed or cut off each time) before it counts as an
    /// infrastructure failure.
    pub max_attempts: u32,
}

impl Default for WorkerPolicy {
    fn default() -> Self {
        WorkerPolicy { max_attempts: 3 }
    }
}

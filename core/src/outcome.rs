//! How a trajectory ended ([`Outcome`]), where it came from ([`Meta`]) and the tooltune runs it belongs to
//! ([`Links`]).

use serde::{Deserialize, Serialize};

/// How a trajectory ended, as judged by whoever logged it (or by tooltune's checks).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// Score in [0, 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    /// Whether the task succeeded. When absent but a score is present, success means score >= 0.5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success: Option<bool>,
    /// Free-text feedback (a grader's comment, a user's complaint, a check's message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feedback: Option<String>,
}

impl Outcome {
    /// The success verdict, derived from the score when not given explicitly.
    pub fn effective_success(&self) -> Option<bool> {
        self.success.or(self.score.map(|s| s >= 0.5))
    }
}

/// Where a trajectory came from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// The producer format or component (`tooltune`, `openai`, `langfuse`, `otel`, `evaluator`).
    #[serde(default)]
    pub source: String,
    /// The model that played the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The client/host that ran the agent (self-reported; for logs only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    /// The producer's own id for the run (trace id, completion id), for finding it again in the producer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_id: Option<String>,
    /// RFC 3339 time at which the run started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
}

/// Links to tooltune's own runs, for trajectories that tooltune's evaluator wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Links {
    /// The optimisation or evaluation run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// The candidate (set of descriptions) that was evaluated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate_id: Option<String>,
    /// Which rollout of the (task, candidate) pair this is, when a task is rolled out several times.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<u32>,
}

impl Links {
    pub(crate) fn is_empty(&self) -> bool {
        self.run_id.is_none() && self.candidate_id.is_none() && self.rollout.is_none()
    }
}

//! The run model: what an optimisation run is asked to do ([`RunConfig`]), what it says as it goes ([`Event`]), what
//! it leaves when it finishes ([`RunSummary`]), and one view of its candidates ([`CandidateSummary`], [`Progress`])
//! built from the search's checkpoint. The driver writes these; the report and the dashboard read them, so neither
//! needs the driver (and with it the evaluator, MCP and the model) nor reads the optimizer's checkpoint itself.
//!
//! Pure: no IO, no clock. Every type here is stored as JSON in the run's row and events, so each change keeps
//! reading what earlier versions wrote (`#[serde(default)]` on added fields; the enums accept their earlier spellings).

mod config;
mod event;
mod summary;
mod view;

pub use config::{RunConfig, WorkerPolicy};
pub use event::{Event, Phase, validation_metrics};
pub use summary::{
    CandidateSummary, Comparison, Lineage, OriginKind, RunSummary, Status, TaskDelta, TrialScore,
};
pub use view::{Checkpoint, Progress, ProgressCandidate, candidate_summaries, lineage};

use tooltune_optimizer::Descriptions;

/// The content address of a candidate's descriptions: rollouts of equal candidates share stored results, and the
/// report finds a candidate's stored rollouts under it.
pub fn candidate_key(descriptions: &Descriptions) -> String {
    let v = serde_json::to_value(descriptions).unwrap_or_default();
    format!(
        "cand-{}",
        tooltune_core::DescriptionId::of("candidate", "", &v).short()
    )
}

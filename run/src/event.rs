//! What a run says as it goes: stored as the run's events (one JSON object each) and handed to the caller's
//! callback; the report's charts and the dashboard's live view are drawn from them.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tooltune_objectives::{Metrics, Objective};

/// Progress, as it happens. Stored as the run's events and handed to the caller's callback.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The run began or resumed.
    Started {
        /// Run id.
        run_id: String,
        /// The objective.
        objective: Objective,
        /// True when resuming.
        resumed: bool,
    },
    /// A candidate is being evaluated.
    Evaluating {
        /// Candidate number.
        candidate: u32,
        /// `validation`, `minibatch`, `merge` or `test`.
        phase: String,
        /// How many tasks.
        tasks: usize,
    },
    /// A candidate was evaluated.
    Evaluated {
        /// Candidate number.
        candidate: u32,
        /// The phase.
        phase: String,
        /// Mean objective score over the tasks.
        mean: f64,
        /// Both metrics over the tasks of this evaluation (boxed: it is much larger than the other events).
        metrics: Box<Metrics>,
        /// Rollouts spent so far (as the search counts them).
        rollouts_spent: u64,
        /// Screened task evaluations spent so far (as the search counts them: a parent's screen is not counted
        /// again). Absent from events stored before screening existed.
        #[serde(default)]
        screened_spent: u64,
    },
    /// The reflector is asked for a new description.
    Reflecting {
        /// Parent candidate.
        parent: u32,
        /// Tool.
        tool: String,
    },
    /// The reflector answered.
    Proposed {
        /// Parent candidate.
        parent: u32,
        /// Tool.
        tool: String,
        /// The new description, if the reply parsed.
        description: Option<String>,
        /// The diagnosis.
        diagnosis: Option<String>,
        /// Why it failed, if it did.
        error: Option<String>,
    },
    /// The search stopped.
    Stopped {
        /// Why.
        reason: String,
    },
    /// The final comparison on the test split is done.
    Finished {
        /// The best candidate.
        best: u32,
    },
}

/// Each candidate's validation metrics from a run's events: the last validation evaluation of each (a resumed run
/// repeats the one in flight, with the same figures).
pub fn validation_metrics<'a>(
    events: impl IntoIterator<Item = &'a Event>,
) -> BTreeMap<u32, Metrics> {
    let mut out = BTreeMap::new();
    for e in events {
        if let Event::Evaluated {
            candidate,
            phase,
            metrics,
            ..
        } = e
            && phase == "validation"
        {
            out.insert(*candidate, (**metrics).clone());
        }
    }
    out
}

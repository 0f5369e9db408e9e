//! What a run says as it goes: stored as the run's events (one JSON object each) and handed to the caller's
//! callback; the report's charts and the dashboard's live view are drawn from them.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
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
        /// Which evaluation.
        phase: Phase,
        /// How many tasks.
        tasks: usize,
    },
    /// A candidate was evaluated.
    Evaluated {
        /// Candidate number.
        candidate: u32,
        /// Which evaluation.
        phase: Phase,
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
        /// Tool; a reflection whose proposals are spread over several tools names them all, joined by ", ".
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

/// Which evaluation of a run an [`Event::Evaluating`] / [`Event::Evaluated`] is. Stored (and shown) as the words
/// it always was: `validation`, `minibatch`, `merge`, `test`, `screen`, `screen (parent)`, and `validation (screen)`
/// and so on for a search evaluation answered by a screen (selection and routing with screening on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// On the validation split (or its sample): the figures candidates are compared by.
    Validation {
        /// Answered by a screen (exact first moves), not rollouts.
        screened: bool,
    },
    /// On a minibatch of training tasks: GEPA's acceptance test.
    Minibatch {
        /// Answered by a screen.
        screened: bool,
    },
    /// A merge's trial on a validation subsample.
    Merge {
        /// Answered by a screen.
        screened: bool,
    },
    /// The held-out comparison of seed and winner.
    Test,
    /// A proposal's screen beside its parent's.
    Screen,
    /// The parent's screen, made beside its proposals'.
    ScreenParent,
}

impl Phase {
    /// The validation evaluation made with rollouts (or, in a decisive search, not at all: see `screened`).
    pub const VALIDATION: Phase = Phase::Validation { screened: false };

    /// The same evaluation answered by a screen. `Test`, `Screen` and `ScreenParent` stay as they are.
    pub fn screened(self) -> Phase {
        match self {
            Phase::Validation { .. } => Phase::Validation { screened: true },
            Phase::Minibatch { .. } => Phase::Minibatch { screened: true },
            Phase::Merge { .. } => Phase::Merge { screened: true },
            other => other,
        }
    }

    /// Whether the evaluation is a screen (exact first moves, no rollouts).
    pub fn is_screen(self) -> bool {
        match self {
            Phase::Validation { screened }
            | Phase::Minibatch { screened }
            | Phase::Merge { screened } => screened,
            Phase::Test => false,
            Phase::Screen | Phase::ScreenParent => true,
        }
    }

    /// Every phase, for reading a stored word back through the one table in `Display`.
    const ALL: [Phase; 9] = [
        Phase::Validation { screened: false },
        Phase::Validation { screened: true },
        Phase::Minibatch { screened: false },
        Phase::Minibatch { screened: true },
        Phase::Merge { screened: false },
        Phase::Merge { screened: true },
        Phase::Test,
        Phase::Screen,
        Phase::ScreenParent,
    ];

    /// Reads the stored word.
    pub fn parse(word: &str) -> Option<Phase> {
        Phase::ALL.into_iter().find(|p| p.to_string() == word)
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (base, screened) = match *self {
            Phase::Validation { screened } => ("validation", screened),
            Phase::Minibatch { screened } => ("minibatch", screened),
            Phase::Merge { screened } => ("merge", screened),
            Phase::Test => ("test", false),
            Phase::Screen => ("screen", false),
            Phase::ScreenParent => ("screen (parent)", false),
        };
        f.write_str(base)?;
        if screened {
            f.write_str(" (screen)")?;
        }
        Ok(())
    }
}

impl Serialize for Phase {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Phase {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Phase, D::Error> {
        let word = String::deserialize(d)?;
        Phase::parse(&word).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unknown phase {word:?}: not validation, minibatch, merge, test, screen or screen (parent), \
                 with or without \" (screen)\""
            ))
        })
    }
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
            && *phase == Phase::VALIDATION
        {
            out.insert(*candidate, (**metrics).clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_phase_is_stored_as_the_word_it_always_was_and_reads_back() {
        let words = [
            "validation",
            "minibatch",
            "merge",
            "test",
            "screen",
            "screen (parent)",
            "validation (screen)",
            "minibatch (screen)",
            "merge (screen)",
        ];
        for w in words {
            let p = Phase::parse(w).unwrap_or_else(|| panic!("{w} parses"));
            assert_eq!(p.to_string(), w);
            assert_eq!(
                serde_json::to_value(p).expect("serialises"),
                serde_json::json!(w)
            );
            assert_eq!(
                serde_json::from_value::<Phase>(serde_json::json!(w)).expect("reads"),
                p
            );
            assert_eq!(p.is_screen(), w.contains("screen"), "{w}");
        }
        for bad in ["test (screen)", "screen (screen)", "Validation", ""] {
            assert_eq!(Phase::parse(bad), None, "{bad}");
        }
        let e = serde_json::from_value::<Phase>(serde_json::json!("warmup")).expect_err("unknown");
        assert!(e.to_string().contains("unknown phase \"warmup\""), "{e}");
        assert_eq!(Phase::Test.screened(), Phase::Test);
        assert_eq!(
            Phase::VALIDATION.screened().to_string(),
            "validation (screen)"
        );
    }

    #[test]
    fn validation_metrics_take_rolled_out_validations_only() {
        let ev = |candidate, phase: Phase| Event::Evaluated {
            candidate,
            phase,
            mean: 0.5,
            metrics: Box::new(Metrics::from_rollouts(&[])),
            rollouts_spent: 0,
            screened_spent: 0,
        };
        let events = [
            ev(0, Phase::VALIDATION),
            ev(1, Phase::Minibatch { screened: false }),
            ev(2, Phase::VALIDATION.screened()),
        ];
        assert_eq!(
            validation_metrics(&events)
                .keys()
                .copied()
                .collect::<Vec<_>>(),
            vec![0]
        );
    }
}

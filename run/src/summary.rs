//! What a finished run leaves (its summary: the winner against the seed on the held-out split, the winner's
//! lineage, every candidate), and the words the run model uses for a candidate's origin and status.

use serde::{Deserialize, Deserializer, Serialize};
use tooltune_objectives::{InflationReport, Metrics, Objective};
use tooltune_optimizer::{CandidateStatus, Descriptions, Origin, Spent};

/// How a candidate came to be, without the details the search keeps (a merge's ancestor and tool split; a
/// reflection's tool and diagnosis are fields of their own in the views).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OriginKind {
    /// The server's own descriptions, or the draft the run was started from.
    Seed,
    /// The reflector rewrote one tool's description of its parent.
    Reflection,
    /// Tool-by-tool combination of two candidates.
    Merge,
}

impl OriginKind {
    /// The origin's kind, the tool a reflection changed and its diagnosis.
    pub fn of(origin: &Origin) -> (OriginKind, Option<String>, Option<String>) {
        match origin {
            Origin::Seed => (OriginKind::Seed, None, None),
            Origin::Reflection { tool, diagnosis } => (
                OriginKind::Reflection,
                Some(tool.clone()),
                diagnosis.clone(),
            ),
            Origin::Merge { .. } => (OriginKind::Merge, None, None),
        }
    }

    /// The name used in JSON and on screen.
    pub fn as_str(self) -> &'static str {
        match self {
            OriginKind::Seed => "seed",
            OriginKind::Reflection => "reflection",
            OriginKind::Merge => "merge",
        }
    }
}

/// Where a candidate stands in the search (the optimizer's `CandidateStatus` without its figures, which
/// [`TrialScore`] carries).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Being tried on a minibatch (reflection) or a validation subsample (merge).
    Trial,
    /// Passed its trial; being evaluated on the rest of the validation split.
    Validating,
    /// Fully validated: in the pool the frontier and the best are chosen from.
    InPool,
    /// Did not beat its parent(s) on its trial tasks.
    Rejected,
    /// Not rolled out: another proposal of the same reflection screened better, or its screen fell too far
    /// behind its parent's.
    ScreenedOut,
    /// The run stopped before its evaluation finished.
    Abandoned,
}

/// A rejected candidate's trial sum against the sum it had to beat, or a screened-out one's mean screen against
/// its parent's.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TrialScore {
    /// Its own score.
    pub score: f64,
    /// The score it had to reach.
    pub to_beat: f64,
}

impl Status {
    /// The status of a search candidate, with its trial figures when it was rejected or screened out.
    pub fn of(status: &CandidateStatus) -> (Status, Option<TrialScore>) {
        match *status {
            CandidateStatus::Trial => (Status::Trial, None),
            CandidateStatus::Validating => (Status::Validating, None),
            CandidateStatus::InPool => (Status::InPool, None),
            CandidateStatus::Rejected { score, to_beat } => {
                (Status::Rejected, Some(TrialScore { score, to_beat }))
            }
            CandidateStatus::ScreenedOut { screen, parent } => (
                Status::ScreenedOut,
                Some(TrialScore {
                    score: screen,
                    to_beat: parent,
                }),
            ),
            CandidateStatus::Abandoned => (Status::Abandoned, None),
        }
    }

    /// Whether the candidate passed its trial (it is, or was being, validated).
    pub fn accepted(self) -> bool {
        matches!(self, Status::InPool | Status::Validating)
    }

    /// The name used in JSON and on screen.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Trial => "trial",
            Status::Validating => "validating",
            Status::InPool => "in_pool",
            Status::Rejected => "rejected",
            Status::ScreenedOut => "screened_out",
            Status::Abandoned => "abandoned",
        }
    }

    /// Reads a status by its name, or in the form summaries held before this type existed: the optimizer's
    /// `Debug` text (`InPool`, `Rejected { score: 0.5, to_beat: 1.0 }`), of which the leading word decides.
    pub fn parse(text: &str) -> Option<Status> {
        let word = text
            .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
            .next()
            .unwrap_or("");
        Some(match word {
            "trial" | "Trial" => Status::Trial,
            "validating" | "Validating" => Status::Validating,
            "in_pool" | "InPool" => Status::InPool,
            "rejected" | "Rejected" => Status::Rejected,
            "screened_out" | "ScreenedOut" => Status::ScreenedOut,
            "abandoned" | "Abandoned" => Status::Abandoned,
            _ => return None,
        })
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for OriginKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Status {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Status, D::Error> {
        let text = String::deserialize(d)?;
        Status::parse(&text).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unknown candidate status {text:?}: expected trial, validating, in_pool, rejected, screened_out \
                 or abandoned"
            ))
        })
    }
}

/// One step of the winner's ancestry.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Lineage {
    /// Candidate number.
    pub candidate: u32,
    /// How it was made.
    pub origin: OriginKind,
    /// The tool it changed, for reflections.
    pub tool: Option<String>,
    /// The reflector's diagnosis that led to it.
    pub diagnosis: Option<String>,
    /// The target tool's description in it.
    pub description: String,
}

/// One candidate's figures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CandidateSummary {
    /// Candidate number.
    pub id: u32,
    /// Parents.
    pub parents: Vec<u32>,
    /// How it was made.
    pub origin: OriginKind,
    /// The tool a reflection changed.
    pub tool: Option<String>,
    /// The reflector's diagnosis.
    pub diagnosis: Option<String>,
    /// Its status in the search.
    pub status: Status,
    /// For a rejected or screened-out candidate: its score and the score it had to reach. Absent from summaries
    /// written before it existed (their status held the figures as text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trial: Option<TrialScore>,
    /// Its descriptions.
    pub descriptions: Descriptions,
    /// Mean objective score on the validation split, when it was evaluated there.
    pub validation_mean: Option<f64>,
    /// Both metrics on the validation split, when evaluated there.
    pub validation: Option<Metrics>,
    /// Rollouts spent when it was found.
    pub found_at_rollouts: Option<u64>,
    /// Run wall time, seconds, when it was found.
    pub found_at_seconds: Option<f64>,
    /// Reflection tokens spent when it was found.
    pub found_at_reflection_tokens: Option<u64>,
    /// Inflation measures of the target tool's description.
    pub inflation: InflationReport,
}

/// Seed versus winner on the test split.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Comparison {
    /// The split compared on.
    pub split: String,
    /// Seed's metrics.
    pub seed: Metrics,
    /// Winner's metrics.
    pub winner: Metrics,
    /// Exact McNemar p-value on per-task success.
    pub success_p_value: f64,
    /// Paired permutation p-value on per-task selection scores (exact probabilities where available).
    pub selection_p_value: f64,
    /// Paired permutation p-value on the run's own objective.
    pub objective_p_value: f64,
    /// Paired permutation p-value on per-task routing (exact probability of the right first move where
    /// available).
    #[serde(default)]
    pub routing_p_value: Option<f64>,
    /// Paired permutation p-value on the selection of the target over the tasks other tools own (the inflation
    /// signal).
    #[serde(default)]
    pub off_target_p_value: Option<f64>,
    /// Per task: the winner's routing score minus the seed's (positive: the winner routes it better).
    #[serde(default)]
    pub routing_deltas: Vec<TaskDelta>,
}

/// One task's change between seed and winner.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskDelta {
    /// The task.
    pub task: String,
    /// The tool it belongs to (none: it needs no tool).
    pub owner: Option<String>,
    /// The seed's score.
    pub seed: f64,
    /// The winner's score.
    pub winner: f64,
}

/// A finished run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunSummary {
    /// Run id.
    pub run_id: String,
    /// The objective.
    pub objective: Objective,
    /// The tool whose selection is measured.
    pub target: String,
    /// Why the search stopped.
    pub stop_reason: String,
    /// What the search spent and did, its own counters as it stopped (rollouts, screened task evaluations,
    /// proposals, proposals screened out, reflection tokens, iterations, ...). Flattened, so a summary's JSON keeps
    /// them at the top level, under the names summaries stored before this field had; counters an older summary
    /// lacks read as 0.
    #[serde(flatten)]
    pub spent: Spent,
    /// Wall time, seconds.
    pub wall_s: f64,
    /// The best candidate.
    pub winner: u32,
    /// Its descriptions (what `--export` writes).
    pub winner_descriptions: Descriptions,
    /// Its ancestry from the seed, with diagnoses.
    pub lineage: Vec<Lineage>,
    /// Seed vs winner on the held-out test split.
    pub test: Comparison,
    /// Every candidate.
    pub candidates: Vec<CandidateSummary>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_keeps_its_counters_at_the_top_level_and_reads_one_stored_before_the_search_counters()
     {
        let m = Metrics::from_rollouts(&[]);
        let summary = RunSummary {
            run_id: "run-1".into(),
            objective: Objective::TaskSuccess,
            target: "search_docs".into(),
            stop_reason: "RolloutBudget".into(),
            spent: Spent {
                rollouts: 27,
                reflection_tokens: 4321,
                iterations: 3,
                ..Spent::default()
            },
            wall_s: 93.5,
            winner: 0,
            winner_descriptions: Descriptions::new(),
            lineage: Vec::new(),
            test: Comparison {
                split: "test".into(),
                seed: m.clone(),
                winner: m,
                success_p_value: 1.0,
                selection_p_value: 1.0,
                objective_p_value: 1.0,
                routing_p_value: None,
                off_target_p_value: None,
                routing_deltas: Vec::new(),
            },
            candidates: Vec::new(),
        };
        let mut json = serde_json::to_value(&summary).expect("serialises");
        assert_eq!(
            (
                json["rollouts"].as_u64(),
                json["reflection_tokens"].as_u64()
            ),
            (Some(27), Some(4321))
        );
        assert!(json.get("spent").is_none(), "{json}");
        // A summary stored before: the search's other counters absent.
        for k in [
            "iterations",
            "screened",
            "proposals",
            "screened_out",
            "elapsed_ms",
            "accepted",
        ] {
            json.as_object_mut().expect("an object").remove(k);
        }
        let old: RunSummary = serde_json::from_value(json).expect("an older summary reads");
        assert_eq!(
            (
                old.spent.rollouts,
                old.spent.reflection_tokens,
                old.spent.iterations
            ),
            (27, 4321, 0)
        );
    }

    #[test]
    fn a_status_reads_its_own_name_and_the_debug_text_older_summaries_stored() {
        for s in [
            Status::Trial,
            Status::Validating,
            Status::InPool,
            Status::Rejected,
            Status::ScreenedOut,
            Status::Abandoned,
        ] {
            let json = serde_json::to_string(&s).expect("serialises");
            assert_eq!(json, format!("\"{}\"", s.as_str()));
            assert_eq!(serde_json::from_str::<Status>(&json).expect("reads"), s);
        }
        let old: Status =
            serde_json::from_str("\"Rejected { score: 0.5, to_beat: 1.0 }\"").expect("reads");
        assert_eq!(old, Status::Rejected);
        assert_eq!(Status::parse("InPool"), Some(Status::InPool));
        assert_eq!(
            Status::parse("ScreenedOut { screen: 0.1, parent: 0.2 }"),
            Some(Status::ScreenedOut)
        );
        let err = serde_json::from_str::<Status>("\"Pooled\"").expect_err("unknown");
        assert!(
            err.to_string()
                .contains("unknown candidate status \"Pooled\""),
            "{err}"
        );
    }

    #[test]
    fn only_pooled_and_validating_candidates_count_as_accepted() {
        let accepted: Vec<Status> = [
            Status::Trial,
            Status::Validating,
            Status::InPool,
            Status::Rejected,
            Status::ScreenedOut,
            Status::Abandoned,
        ]
        .into_iter()
        .filter(|s| s.accepted())
        .collect();
        assert_eq!(accepted, vec![Status::Validating, Status::InPool]);
    }

    #[test]
    fn a_search_status_keeps_its_figures_as_a_trial_score() {
        let (s, t) = Status::of(&CandidateStatus::ScreenedOut {
            screen: 0.25,
            parent: 0.5,
        });
        assert_eq!(s, Status::ScreenedOut);
        assert_eq!(
            t,
            Some(TrialScore {
                score: 0.25,
                to_beat: 0.5
            })
        );
        assert_eq!(Status::of(&CandidateStatus::InPool), (Status::InPool, None));
    }

    #[test]
    fn origins_and_objectives_keep_the_spellings_stored_before_they_were_enums() {
        for (text, kind) in [
            ("seed", OriginKind::Seed),
            ("reflection", OriginKind::Reflection),
            ("merge", OriginKind::Merge),
        ] {
            let quoted = format!("\"{text}\"");
            assert_eq!(
                serde_json::from_str::<OriginKind>(&quoted).expect("reads"),
                kind
            );
            assert_eq!(serde_json::to_string(&kind).expect("writes"), quoted);
            assert_eq!(kind.as_str(), text);
        }
        for (text, o) in [
            ("success", Objective::TaskSuccess),
            ("selection", Objective::SelectionRate),
            ("routing", Objective::Routing),
        ] {
            assert_eq!(
                serde_json::from_str::<Objective>(&format!("\"{text}\"")).expect("reads"),
                o
            );
        }
    }
}

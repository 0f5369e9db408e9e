//! The search's configuration: which tools to mutate, minibatch and merge sizes, budget and stop conditions.

use crate::OptimizerError;
use serde::{Deserialize, Serialize};

/// Limits on what a run may spend. Each is checked before every new action, so a run overshoots a limit by at
/// most one action's worth.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Budget {
    /// Rollouts (task plays) over all evaluations, as reported by the driver.
    pub max_rollouts: Option<u64>,
    /// Tokens (prompt and completion) spent by the reflector, including failed proposals.
    pub max_reflection_tokens: Option<u64>,
    /// Wall time of the run in milliseconds, as measured by the driver.
    pub max_wall_ms: Option<u64>,
    /// Screened task evaluations (exact first-move scores of a candidate on a task, no rollout).
    pub max_screened: Option<u64>,
}

/// Multi-fidelity evaluation: every proposal is first screened by an exact, cheap measure (the agent's first-move
/// distribution on each task, no rollout), and only what the screen lets through is rolled out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Screening {
    /// Proposals asked of one reflection (k); all are screened and the best goes on.
    pub proposals: usize,
    /// The screen is the objective (selection, routing): the driver answers every evaluation with a screen, so
    /// the search spends no rollouts. Acceptance is still GEPA's (strictly better on the minibatch).
    pub decisive: bool,
    /// Not decisive (task success): a proposal whose mean screen score falls more than this below its parent's
    /// on the same tasks is not rolled out.
    pub margin: f64,
    /// Screen proposals on the validation tasks as well as the minibatch (a decisive screen then also gives the
    /// accepted child's validation scores).
    pub on_validation: bool,
    /// Not on validation: this many training tasks, the same for the whole search, are screened beside the
    /// minibatch. A minibatch of three tells the proposals apart on three tasks only; a fixed sample adds a
    /// broader view at a fraction of a validation screen's cost, and its parent scores are reused (cached) from
    /// one iteration to the next because the sample does not change.
    pub sample: usize,
    /// Task success: each rolled-out task's score becomes `(1 - w) x success + w x` its exact probability of the
    /// right first move (from the same rollout), so that a child and its parent with the same successes on a
    /// three-task minibatch, the usual case, are told apart by how surely the agent routes each task instead of
    /// the child being refused. The rollouts still decide: over fewer than (1 - w) / w tasks no routing difference
    /// outweighs one success. 0 turns it off. A checkpoint written before the
    /// field existed reads as 0, so a resumed run keeps scoring the way it started.
    #[serde(default)]
    pub tie_break: f64,
    /// With several tools under study, a reflection's proposals are spread over them (two a tool, the tools
    /// taken in turn from the round-robin's next one; [`crate::proposal_tool`]) and the screen picks among all,
    /// instead of every proposal of a round rewriting the round-robin's one tool. A search whose budget buys one
    /// or two rounds (the demo's: one with task success) otherwise never rewrites any tool but the first, whatever
    /// the evidence; spread, the screen decides which tool's change is worth the rollouts. A checkpoint written
    /// before the field existed reads as off, so a resumed run keeps proposing the way it started.
    #[serde(default)]
    pub spread: bool,
}

impl Screening {
    /// The default [`Screening::tie_break`]: with minibatches and validation samples under a hundred tasks the
    /// bonus stays below a tenth of one task's success.
    pub const DEFAULT_TIE_BREAK: f64 = 0.001;

    /// Training tasks a gate screens beside the minibatch by default: measured on the contractor suite, a
    /// proposal's screen costs about a prefix decode (9-10 s on two AVX2 cores) plus 1.45 s a task, so 12 tasks
    /// keep a gate near a third of a validation screen (38 tasks).
    pub const DEFAULT_SAMPLE: usize = 12;

    /// The screening of an objective whose screen is (`decisive`: selection, routing) or is not (task success)
    /// the objective itself, with the defaults for each: a decisive screen covers the validation split (it *is*
    /// the validation), a gate the minibatch plus a fixed training sample.
    pub fn for_objective(decisive: bool, proposals: usize) -> Screening {
        Screening {
            proposals: proposals.max(1),
            decisive,
            on_validation: decisive,
            sample: if decisive { 0 } else { Self::DEFAULT_SAMPLE },
            ..Screening::default()
        }
    }
}

impl Default for Screening {
    fn default() -> Self {
        Screening {
            proposals: 4,
            decisive: false,
            margin: 0.02,
            on_validation: true,
            sample: 0,
            tie_break: Self::DEFAULT_TIE_BREAK,
            spread: true,
        }
    }
}

/// How the search runs. [`Config::new`] gives GEPA's defaults for a list of tools.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Tools under study, in the round-robin order in which their descriptions are mutated. Each must have a
    /// description in the seed candidate; other tools in the seed are carried along unchanged.
    pub tools: Vec<String>,
    /// Training tasks per reflection minibatch (GEPA: 3).
    pub minibatch_size: usize,
    /// Most merges attempted in a run (GEPA: 5); 0 disables merging.
    pub max_merges: u32,
    /// Validation tasks a merged candidate is first tried on (GEPA: 5).
    pub merge_subsample: usize,
    /// A parent scoring at least this on every minibatch task has nothing to learn there: the reflection is
    /// skipped (saving the reflector's tokens). `None` always reflects.
    pub perfect_score: Option<f64>,
    /// Spending limits.
    pub budget: Budget,
    /// Stop once the best candidate's mean validation score reaches this.
    pub score_threshold: Option<f64>,
    /// Stop after this many iterations in a row without a better best candidate.
    pub patience: Option<u32>,
    /// Stop after this many iterations (each is one reflection or one merge attempt).
    pub max_iterations: Option<u32>,
    /// Screen proposals before rolling them out; `None` is GEPA as published (one proposal, rollouts only).
    pub screening: Option<Screening>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            tools: Vec::new(),
            minibatch_size: 3,
            max_merges: 5,
            merge_subsample: 5,
            perfect_score: Some(1.0),
            budget: Budget::default(),
            score_threshold: None,
            patience: None,
            max_iterations: None,
            screening: None,
        }
    }
}

impl Config {
    /// GEPA's defaults for these tools; set at least one limit (budget, patience or iterations) before use.
    pub fn new(tools: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Config {
            tools: tools.into_iter().map(Into::into).collect(),
            ..Config::default()
        }
    }

    /// Checks ranges and that the run can end on its own.
    pub fn validate(&self) -> Result<(), OptimizerError> {
        let bad = |field, reason: &str| {
            Err(OptimizerError::InvalidConfig {
                field,
                reason: reason.to_string(),
            })
        };
        if self.tools.is_empty() {
            return bad("tools", "is empty: name at least one tool under study");
        }
        for (i, t) in self.tools.iter().enumerate() {
            if self.tools[..i].contains(t) {
                return Err(OptimizerError::InvalidConfig {
                    field: "tools",
                    reason: format!("names {t:?} twice"),
                });
            }
        }
        if self.minibatch_size == 0 {
            return bad("minibatch_size", "must be at least 1");
        }
        if self.max_merges > 0 && self.merge_subsample == 0 {
            return bad("merge_subsample", "must be at least 1 when merging is on");
        }
        for (field, v) in [
            ("perfect_score", self.perfect_score),
            ("score_threshold", self.score_threshold),
        ] {
            if v.is_some_and(|v| !(0.0..=1.0).contains(&v)) {
                return bad(field, "must lie in [0, 1]");
            }
        }
        if let Some(sc) = &self.screening {
            if sc.proposals == 0 {
                return bad("screening.proposals", "must be at least 1");
            }
            if !(0.0..=1.0).contains(&sc.margin) {
                return bad("screening.margin", "must lie in [0, 1]");
            }
        }
        let b = &self.budget;
        let bounded = b.max_rollouts.is_some()
            || b.max_screened.is_some()
            || b.max_reflection_tokens.is_some()
            || b.max_wall_ms.is_some()
            || self.patience.is_some()
            || self.max_iterations.is_some();
        if !bounded {
            return bad(
                "budget",
                "sets no limit: give max_rollouts, max_screened, max_reflection_tokens, max_wall_ms, patience or \
                 max_iterations",
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_gepas_and_need_a_limit() {
        let c = Config::new(["search_docs"]);
        assert_eq!(
            (c.minibatch_size, c.max_merges, c.merge_subsample),
            (3, 5, 5)
        );
        assert!(matches!(
            c.validate(),
            Err(OptimizerError::InvalidConfig {
                field: "budget",
                ..
            })
        ));
        let c = Config {
            patience: Some(3),
            ..c
        };
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn bad_fields_are_named() {
        let ok = Config {
            max_iterations: Some(1),
            ..Config::new(["a", "b"])
        };
        let field = |c: Config| match c.validate() {
            Err(OptimizerError::InvalidConfig { field, .. }) => field,
            other => panic!("expected a config error, got {other:?}"),
        };
        assert_eq!(
            field(Config {
                tools: vec![],
                ..ok.clone()
            }),
            "tools"
        );
        assert_eq!(
            field(Config {
                tools: vec!["a".into(), "a".into()],
                ..ok.clone()
            }),
            "tools"
        );
        assert_eq!(
            field(Config {
                minibatch_size: 0,
                ..ok.clone()
            }),
            "minibatch_size"
        );
        assert_eq!(
            field(Config {
                merge_subsample: 0,
                ..ok.clone()
            }),
            "merge_subsample"
        );
        assert_eq!(
            field(Config {
                score_threshold: Some(1.5),
                ..ok.clone()
            }),
            "score_threshold"
        );
        assert_eq!(
            field(Config {
                perfect_score: Some(-0.1),
                ..ok.clone()
            }),
            "perfect_score"
        );
    }

    #[test]
    fn config_deserialises_with_defaults_and_rejects_unknown_fields() {
        let c: Config =
            serde_json::from_str(r#"{"tools": ["a"], "budget": {"max_rollouts": 100}}"#)
                .expect("parses");
        assert_eq!((c.minibatch_size, c.budget.max_rollouts), (3, Some(100)));
        assert!(serde_json::from_str::<Config>(r#"{"tools": ["a"], "minibatch": 3}"#).is_err());
    }

    #[test]
    fn a_screening_saved_before_the_tie_break_resumes_without_one_and_new_ones_have_it() {
        let old: Screening =
            serde_json::from_str(r#"{"proposals": 4, "decisive": false, "margin": 0.02}"#)
                .expect("parses");
        assert_eq!(old.tie_break, 0.0);
        assert_eq!(
            Screening::for_objective(false, 4).tie_break,
            Screening::DEFAULT_TIE_BREAK
        );
    }
}

//! The two objectives a run can optimise (task success, selection of the tool under study), the per-rollout facts
//! they are computed from, and the [`Metrics`] every run records whichever objective it optimises.
//!
//! Selection is measured at the **first tool call**: that is the moment the agent chooses among the descriptions,
//! and the only one for which a backend can give an exact probability ([`RolloutFacts::p_first_target`]). Whether
//! the target was called at all is kept as a second rate ([`Metrics::selection_any`]).

use crate::ObjectivesError;
use crate::stats::Rate;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;
use tooltune_core::Trajectory;

/// What a run optimises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Objective {
    /// Solve as many tasks as possible (the suite's checks decide).
    #[serde(rename = "success")]
    TaskSuccess,
    /// Have the tool under study chosen as often as possible, over every task of the suite, including tasks that
    /// belong to other tools. This is the objective that rewards inflation; it exists so that the inflation can be
    /// measured, not because it is a good thing to optimise.
    #[serde(rename = "selection")]
    SelectionRate,
    /// Have every task's first move be the right one: its owner tool, or no tool for a task that needs none,
    /// averaged over every task (the target's and its competitors'). The honest counterpart of selection rate:
    /// selection rewards taking every task, routing rewards taking the right ones.
    #[serde(rename = "routing")]
    Routing,
}

impl Objective {
    /// The name used on the command line and in stored runs.
    pub fn as_str(self) -> &'static str {
        match self {
            Objective::TaskSuccess => "success",
            Objective::SelectionRate => "selection",
            Objective::Routing => "routing",
        }
    }
}

impl fmt::Display for Objective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Objective {
    type Err = ObjectivesError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "success" => Ok(Objective::TaskSuccess),
            "selection" => Ok(Objective::SelectionRate),
            "routing" => Ok(Objective::Routing),
            other => Err(ObjectivesError::UnknownObjective(other.to_string())),
        }
    }
}

/// The facts of one rollout (one play of one task) that the objectives need. Built through [`RolloutFacts::new`]
/// (or deserialised, which runs the same checks), so a value always has a task id, a target and a score in [0, 1].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawRolloutFacts")]
pub struct RolloutFacts {
    task_id: String,
    owner: Option<String>,
    target: String,
    success: bool,
    score: f64,
    tools_called: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    p_first_target: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    p_routed: Option<f64>,
}

/// The unchecked shape of [`RolloutFacts`], as it comes out of JSON.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRolloutFacts {
    task_id: String,
    owner: Option<String>,
    target: String,
    success: bool,
    score: f64,
    tools_called: Vec<String>,
    #[serde(default)]
    p_first_target: Option<f64>,
    #[serde(default)]
    p_routed: Option<f64>,
}

impl TryFrom<RawRolloutFacts> for RolloutFacts {
    type Error = ObjectivesError;

    fn try_from(r: RawRolloutFacts) -> Result<Self, Self::Error> {
        let facts = RolloutFacts::new(
            r.task_id,
            r.owner,
            r.target,
            r.success,
            r.score,
            r.tools_called,
        )?;
        let facts = match r.p_first_target {
            Some(p) => facts.with_first_call_probability(p)?,
            None => facts,
        };
        match r.p_routed {
            Some(p) => facts.with_routing_probability(p),
            None => Ok(facts),
        }
    }
}

impl RolloutFacts {
    /// Checks and builds the facts of one rollout.
    ///
    /// - `task_id`: the suite's task id (several rollouts of one task share it).
    /// - `owner`: the tool the task belongs to (the tool a correct agent would pick), if the suite says.
    /// - `target`: the tool under study.
    /// - `success`, `score`: the suite's verdict; `score` must lie in [0, 1].
    /// - `tools_called`: the tools the agent called, in order.
    pub fn new(
        task_id: impl Into<String>,
        owner: Option<String>,
        target: impl Into<String>,
        success: bool,
        score: f64,
        tools_called: Vec<String>,
    ) -> Result<Self, ObjectivesError> {
        let task_id = task_id.into();
        let target = target.into();
        if task_id.is_empty() {
            return Err(ObjectivesError::EmptyTaskId);
        }
        if target.is_empty() {
            return Err(ObjectivesError::EmptyTarget { task_id });
        }
        if !(0.0..=1.0).contains(&score) {
            return Err(ObjectivesError::ScoreOutOfRange { task_id, score });
        }
        Ok(RolloutFacts {
            task_id,
            owner,
            target,
            success,
            score,
            tools_called,
            p_first_target: None,
            p_routed: None,
        })
    }

    /// Adds the exact probability that the first call picks the target (from a backend that can score the choice).
    pub fn with_first_call_probability(mut self, p: f64) -> Result<Self, ObjectivesError> {
        if !(0.0..=1.0).contains(&p) {
            return Err(ObjectivesError::ProbabilityOutOfRange {
                task_id: self.task_id,
                p,
            });
        }
        self.p_first_target = Some(p);
        Ok(self)
    }

    /// Adds the exact probability that the first move is the right one (the owner tool, or no tool for a task
    /// without an owner).
    pub fn with_routing_probability(mut self, p: f64) -> Result<Self, ObjectivesError> {
        if !(0.0..=1.0).contains(&p) {
            return Err(ObjectivesError::ProbabilityOutOfRange {
                task_id: self.task_id,
                p,
            });
        }
        self.p_routed = Some(p);
        Ok(self)
    }

    /// The facts of a recorded trajectory: the tools it called, and its outcome (success as
    /// [`tooltune_core::Outcome::effective_success`], score defaulting to 1 or 0 from success when absent). A
    /// trajectory without any verdict counts as a failure, because an unjudged rollout proves nothing.
    pub fn from_trajectory(
        trajectory: &Trajectory,
        task_id: impl Into<String>,
        owner: Option<String>,
        target: impl Into<String>,
    ) -> Result<Self, ObjectivesError> {
        let success = trajectory.outcome.effective_success().unwrap_or(false);
        let score = trajectory
            .outcome
            .score
            .unwrap_or(if success { 1.0 } else { 0.0 });
        let called = trajectory.tool_calls().map(|c| c.name.clone()).collect();
        RolloutFacts::new(task_id, owner, target, success, score, called)
    }

    /// The task id.
    pub fn task_id(&self) -> &str {
        &self.task_id
    }
    /// The tool the task belongs to, if known.
    pub fn owner(&self) -> Option<&str> {
        self.owner.as_deref()
    }
    /// The tool under study.
    pub fn target(&self) -> &str {
        &self.target
    }
    /// The suite's success verdict.
    pub fn success(&self) -> bool {
        self.success
    }
    /// The suite's score in [0, 1].
    pub fn score(&self) -> f64 {
        self.score
    }
    /// The tools called, in order.
    pub fn tools_called(&self) -> &[String] {
        &self.tools_called
    }
    /// The exact probability that the first call picks the target, when the backend gave one.
    pub fn p_first_target(&self) -> Option<f64> {
        self.p_first_target
    }
    /// The exact probability that the first move is the right one, when the backend gave one.
    pub fn p_routed(&self) -> Option<f64> {
        self.p_routed
    }
    /// Whether the played first move was the right one: the owner called first, or no tool called at all on a
    /// task without an owner.
    pub fn routed(&self) -> bool {
        routed(
            self.owner.as_deref(),
            self.tools_called.first().map(String::as_str),
        )
    }
    /// Whether the agent's first tool call was the target.
    pub fn chosen_first(&self) -> bool {
        self.tools_called.first().is_some_and(|t| *t == self.target)
    }
    /// Whether the agent called the target at all.
    pub fn chosen_any(&self) -> bool {
        self.tools_called.contains(&self.target)
    }
    /// Whether the task belongs to the target.
    pub fn on_target(&self) -> bool {
        self.owner.as_deref() == Some(self.target.as_str())
    }
    /// Whether the task belongs to another tool (tasks without an owner are neither on nor off target).
    pub fn off_target(&self) -> bool {
        self.owner.as_deref().is_some_and(|o| o != self.target)
    }

    /// This rollout's contribution to an objective: the score for task success; for selection, the exact
    /// first-call probability when present (its expectation equals the 0/1 outcome's, with no sampling noise),
    /// otherwise 1 if the first call was the target and 0 if not.
    pub fn objective_value(&self, objective: Objective) -> f64 {
        match objective {
            Objective::TaskSuccess => self.score,
            Objective::SelectionRate => {
                self.p_first_target
                    .unwrap_or(if self.chosen_first() { 1.0 } else { 0.0 })
            }
            Objective::Routing => self
                .p_routed
                .unwrap_or(if self.routed() { 1.0 } else { 0.0 }),
        }
    }
}

/// Whether a first move is the right one for a task: its owner tool called first, or, for a task without an
/// owner, no tool at all (`first_call` is `None` when the agent answered without calling one). The one rule the
/// routing measure is defined by, played or exact.
pub fn routed(owner: Option<&str>, first_call: Option<&str>) -> bool {
    owner == first_call
}

/// Per-task scores under an objective: the mean of [`RolloutFacts::objective_value`] over each task's rollouts,
/// keyed by task id (sorted, so the result is deterministic). This is what the optimizer compares candidates on.
pub fn per_task_scores(objective: Objective, facts: &[RolloutFacts]) -> BTreeMap<String, f64> {
    let mut sums: BTreeMap<&str, (f64, u32)> = BTreeMap::new();
    for f in facts {
        let e = sums.entry(f.task_id()).or_insert((0.0, 0));
        e.0 += f.objective_value(objective);
        e.1 += 1;
    }
    sums.into_iter()
        .map(|(t, (s, n))| (t.to_string(), s / f64::from(n)))
        .collect()
}

/// Mean of the exact first-call probabilities, over the rollouts that carry one.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ExpectedSelection {
    /// Rollouts that carried a probability.
    pub rollouts: u64,
    /// Mean probability of choosing the target first, over those rollouts.
    pub all: f64,
    /// The same over the target's own tasks, if any carried a probability.
    pub on_target: Option<f64>,
    /// The same over tasks that belong to other tools, if any carried a probability.
    pub off_target: Option<f64>,
}

/// Both objectives (and the inflation signal, off-target selection) from one set of rollouts. Rates are over
/// rollouts; with several rollouts per task they are not independent, so the intervals are optimistic then, and a
/// comparison between candidates should use the paired tests in [`crate::stats`] over per-task scores instead.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct Metrics {
    /// Rollouts counted.
    pub rollouts: u64,
    /// Distinct tasks among them.
    pub tasks: u64,
    /// Share of rollouts the suite judged successful.
    pub success: Rate,
    /// Mean score over rollouts (`None` without rollouts).
    pub mean_score: Option<f64>,
    /// Share of rollouts whose first tool call was the target, over every task.
    pub selection: Rate,
    /// Share of rollouts that called the target at all, over every task.
    pub selection_any: Rate,
    /// First-call selection of the target on the target's own tasks (recall of the right choice).
    pub on_target: Rate,
    /// First-call selection of the target on tasks that belong to another tool: the inflation signal.
    pub off_target: Rate,
    /// Expected selection from exact probabilities, when the backend gave any.
    pub expected: Option<ExpectedSelection>,
    /// Share of rollouts whose first move was the right one (owner first, or no tool where none is needed).
    #[serde(default = "Rate::empty")]
    pub routing: Rate,
    /// Mean exact probability of the right first move, over the rollouts that carry one.
    #[serde(default)]
    pub expected_routing: Option<f64>,
}

impl Metrics {
    /// Computes every metric from one set of rollouts.
    pub fn from_rollouts(facts: &[RolloutFacts]) -> Metrics {
        let n = facts.len() as u64;
        let count =
            |pred: &dyn Fn(&RolloutFacts) -> bool| facts.iter().filter(|f| pred(f)).count() as u64;
        let on: Vec<&RolloutFacts> = facts.iter().filter(|f| f.on_target()).collect();
        let off: Vec<&RolloutFacts> = facts.iter().filter(|f| f.off_target()).collect();
        let chosen = |v: &[&RolloutFacts]| v.iter().filter(|f| f.chosen_first()).count() as u64;
        let mean_p = |v: &mut dyn Iterator<Item = &RolloutFacts>| {
            let (s, k) = v
                .filter_map(|f| f.p_first_target())
                .fold((0.0, 0u64), |(s, k), p| (s + p, k + 1));
            (k > 0).then(|| (s / k as f64, k))
        };
        let expected = mean_p(&mut facts.iter()).map(|(all, rollouts)| ExpectedSelection {
            rollouts,
            all,
            on_target: mean_p(&mut on.iter().copied()).map(|(m, _)| m),
            off_target: mean_p(&mut off.iter().copied()).map(|(m, _)| m),
        });
        let tasks: BTreeSet<&str> = facts.iter().map(|f| f.task_id()).collect();
        let routed: Vec<f64> = facts.iter().filter_map(|f| f.p_routed()).collect();
        Metrics {
            routing: Rate::wilson(count(&|f| f.routed()), n),
            expected_routing: (!routed.is_empty())
                .then(|| routed.iter().sum::<f64>() / routed.len() as f64),
            rollouts: n,
            tasks: tasks.len() as u64,
            success: Rate::wilson(count(&|f| f.success()), n),
            mean_score: (n > 0).then(|| facts.iter().map(|f| f.score()).sum::<f64>() / n as f64),
            selection: Rate::wilson(count(&|f| f.chosen_first()), n),
            selection_any: Rate::wilson(count(&|f| f.chosen_any()), n),
            on_target: Rate::wilson(chosen(&on), on.len() as u64),
            off_target: Rate::wilson(chosen(&off), off.len() as u64),
            expected,
        }
    }

    /// The headline number of an objective: success rate or first-call selection rate (`None` without rollouts).
    pub fn headline(&self, objective: Objective) -> Option<f64> {
        match objective {
            Objective::TaskSuccess => self.success.value,
            Objective::SelectionRate => self.selection.value,
            Objective::Routing => self.expected_routing.or(self.routing.value),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(task: &str, owner: &str, ok: bool, called: &[&str]) -> RolloutFacts {
        RolloutFacts::new(
            task,
            Some(owner.to_string()),
            "search_docs",
            ok,
            if ok { 1.0 } else { 0.0 },
            called.iter().map(|s| s.to_string()).collect(),
        )
        .expect("valid facts")
    }

    #[test]
    fn objective_names_round_trip() {
        for o in [
            Objective::TaskSuccess,
            Objective::SelectionRate,
            Objective::Routing,
        ] {
            assert_eq!(o.to_string().parse::<Objective>(), Ok(o));
            let json = serde_json::to_string(&o).expect("serialises");
            assert_eq!(json, format!("\"{o}\""));
            assert_eq!(serde_json::from_str::<Objective>(&json).expect("parses"), o);
        }
        assert_eq!(
            "reward".parse::<Objective>(),
            Err(ObjectivesError::UnknownObjective("reward".into()))
        );
    }

    #[test]
    fn facts_reject_bad_values_also_when_deserialised() {
        assert!(matches!(
            RolloutFacts::new("t", None, "x", true, 1.5, vec![]),
            Err(ObjectivesError::ScoreOutOfRange { .. })
        ));
        assert!(matches!(
            RolloutFacts::new("t", None, "x", true, f64::NAN, vec![]),
            Err(ObjectivesError::ScoreOutOfRange { .. })
        ));
        assert_eq!(
            RolloutFacts::new("", None, "x", true, 1.0, vec![]),
            Err(ObjectivesError::EmptyTaskId)
        );
        let json = r#"{"task_id":"t","owner":null,"target":"x","success":true,"score":1.0,"tools_called":[],
                       "p_first_target":1.2}"#;
        let err = serde_json::from_str::<RolloutFacts>(json).expect_err("probability out of range");
        assert!(err.to_string().contains("p_first_target"), "{err}");
        let f = facts("t", "web_search", true, &["web_search", "search_docs"])
            .with_first_call_probability(0.25)
            .expect("valid p");
        let back: RolloutFacts =
            serde_json::from_str(&serde_json::to_string(&f).expect("serialises")).expect("parses");
        assert_eq!(back, f);
    }

    #[test]
    fn chosen_first_and_any_and_ownership() {
        let f = facts("t", "web_search", true, &["web_search", "search_docs"]);
        assert!(!f.chosen_first() && f.chosen_any() && f.off_target() && !f.on_target());
        let f = facts("t", "search_docs", true, &["search_docs"]);
        assert!(f.chosen_first() && f.on_target() && !f.off_target());
        let f = RolloutFacts::new("t", None, "search_docs", false, 0.0, vec![]).expect("valid");
        assert!(!f.chosen_any() && !f.on_target() && !f.off_target());
    }

    #[test]
    fn routed_is_the_owner_first_or_no_tool_where_none_is_needed() {
        assert!(facts("t", "web_search", true, &["web_search", "search_docs"]).routed());
        assert!(!facts("t", "web_search", true, &["search_docs", "web_search"]).routed());
        assert!(!facts("t", "web_search", false, &[]).routed());
        let none = |called: &[&str]| {
            RolloutFacts::new(
                "t",
                None,
                "search_docs",
                true,
                1.0,
                called.iter().map(|s| s.to_string()).collect(),
            )
            .expect("valid")
        };
        assert!(none(&[]).routed());
        assert!(!none(&["search_docs"]).routed());
        // The exact probability, when given, is what the routing objective counts.
        let f = facts("t", "web_search", true, &["web_search"])
            .with_routing_probability(0.25)
            .expect("valid p");
        assert_eq!(f.objective_value(Objective::Routing), 0.25);
        assert_eq!(
            facts("t", "web_search", true, &["web_search"]).objective_value(Objective::Routing),
            1.0
        );
    }

    #[test]
    fn per_task_scores_average_rollouts() {
        let v = vec![
            facts("a", "search_docs", true, &["search_docs"]),
            facts("a", "search_docs", false, &["web_search"]),
            facts("a", "search_docs", true, &["search_docs"]),
            facts("b", "web_search", false, &["search_docs"]),
        ];
        let s = per_task_scores(Objective::TaskSuccess, &v);
        assert_eq!(s.len(), 2);
        assert!((s["a"] - 2.0 / 3.0).abs() < 1e-12 && s["b"] == 0.0, "{s:?}");
        let s = per_task_scores(Objective::SelectionRate, &v);
        assert!((s["a"] - 2.0 / 3.0).abs() < 1e-12 && s["b"] == 1.0, "{s:?}");
        // An exact probability replaces the sampled 0/1 outcome.
        let v = vec![
            facts("a", "search_docs", true, &["search_docs"])
                .with_first_call_probability(0.3)
                .expect("valid p"),
        ];
        assert_eq!(per_task_scores(Objective::SelectionRate, &v)["a"], 0.3);
    }

    #[test]
    fn metrics_record_both_objectives_and_off_target() {
        let v = vec![
            // Own tasks: chosen 2 of 3, solved 2 of 3.
            facts("d1", "search_docs", true, &["search_docs"]),
            facts("d2", "search_docs", true, &["search_docs"]),
            facts("d3", "search_docs", false, &["web_search"]),
            // Another tool's tasks: wrongly chosen 1 of 2 (then corrected in one).
            facts("w1", "web_search", true, &["search_docs", "web_search"]),
            facts("w2", "web_search", true, &["web_search"]),
        ];
        let m = Metrics::from_rollouts(&v);
        assert_eq!((m.rollouts, m.tasks), (5, 5));
        assert_eq!((m.success.hits, m.success.trials), (4, 5));
        assert_eq!((m.selection.hits, m.selection.trials), (3, 5));
        assert_eq!((m.selection_any.hits, m.selection_any.trials), (3, 5));
        assert_eq!((m.on_target.hits, m.on_target.trials), (2, 3));
        assert_eq!((m.off_target.hits, m.off_target.trials), (1, 2));
        assert_eq!(m.mean_score, Some(0.8));
        assert_eq!(m.expected, None);
        assert_eq!(m.headline(Objective::TaskSuccess), Some(0.8));
        assert_eq!(m.headline(Objective::SelectionRate), Some(0.6));
        assert!(m.success.low < 0.8 && m.success.high > 0.8);
    }

    #[test]
    fn expected_selection_uses_the_rollouts_that_carry_probabilities() {
        let p = |f: RolloutFacts, p: f64| f.with_first_call_probability(p).expect("valid p");
        let v = vec![
            p(facts("d1", "search_docs", true, &["search_docs"]), 0.9),
            p(facts("w1", "web_search", true, &["web_search"]), 0.1),
            p(facts("w2", "web_search", true, &["web_search"]), 0.3),
            facts("w3", "web_search", true, &["web_search"]),
        ];
        let e = Metrics::from_rollouts(&v)
            .expected
            .expect("probabilities given");
        assert_eq!(e.rollouts, 3);
        assert!((e.all - 1.3 / 3.0).abs() < 1e-12);
        assert_eq!(e.on_target, Some(0.9));
        assert!((e.off_target.expect("off-target probabilities") - 0.2).abs() < 1e-12);
    }

    #[test]
    fn metrics_of_nothing_are_empty_rates() {
        let m = Metrics::from_rollouts(&[]);
        assert_eq!((m.rollouts, m.tasks, m.mean_score), (0, 0, None));
        assert_eq!(m.success.value, None);
        assert_eq!(m.headline(Objective::SelectionRate), None);
    }

    #[test]
    fn facts_from_a_trajectory() {
        let t: Trajectory = serde_json::from_value(serde_json::json!({
            "task": "Read notes.txt and sum the numbers in it.",
            "tools": [{"name": "read_file", "description": "Read a file."},
                      {"name": "calculator", "description": "Evaluate arithmetic."}],
            "steps": [
                {"type": "model", "tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]},
                {"type": "model", "tool_calls": [{"name": "calculator", "arguments": {"expression": "1+2"}}]}
            ],
            "outcome": {"score": 1.0}
        }))
        .expect("a valid trajectory");
        let f =
            RolloutFacts::from_trajectory(&t, "sum-notes", Some("read_file".into()), "read_file")
                .expect("valid facts");
        assert_eq!(f.tools_called(), ["read_file", "calculator"]);
        assert!(f.success() && f.score() == 1.0 && f.chosen_first() && f.on_target());
    }
}

//! Two evaluations of the same tasks side by side: which candidate did better, task by task, with a paired test
//! for each measure (exact McNemar on success, sign-flip permutation on the per-task probabilities).
//!
//! What a server author asks after rewriting a description ("is v2 better than what ships?") and what a
//! classroom asks of an optimiser's winner; `tooltune eval --against BASELINE.json` prints it.

use crate::EvalError;
use crate::evaluate::{Mode, SuiteResult, TaskResult};
use serde::Serialize;
use std::collections::BTreeMap;
use tooltune_objectives::stats::{MonteCarlo, mcnemar_exact, paired_permutation};

/// One measure compared: the baseline's and the candidate's mean over the paired tasks, and the paired test.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MeasureDelta {
    /// Tasks in the comparison (both evaluations measured them).
    pub tasks: u64,
    /// The baseline's mean.
    pub baseline: f64,
    /// The candidate's mean.
    pub candidate: f64,
    /// Tasks where the candidate did better / worse.
    pub better: u64,
    /// See `better`.
    pub worse: u64,
    /// Two-sided p-value of the paired test.
    pub p_value: f64,
    /// The test: `mcnemar_exact` or `paired_permutation`.
    pub test: &'static str,
}

/// The comparison of a candidate's evaluation with a baseline's on the tasks both judged.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// The suite.
    pub suite: String,
    /// Tasks judged by both (infrastructure failures on either side are left out).
    pub tasks: u64,
    /// Tasks only one of them judged (a different split or task list, or an infrastructure failure).
    pub unpaired: u64,
    /// Greedy task success (full evaluations only).
    pub success: Option<MeasureDelta>,
    /// Success in expectation over the first move (both evaluations measured it).
    pub expected_success: Option<MeasureDelta>,
    /// Exact probability of the right first move.
    pub routing: Option<MeasureDelta>,
    /// Exact probability that the first call picks the tool under study.
    pub selection: Option<MeasureDelta>,
    /// The same on the tasks another tool owns.
    pub off_target_selection: Option<MeasureDelta>,
}

/// Pairs `candidate` with `baseline` by task id and tests every measure both carry. Errors when the two are of
/// different suites, targets or modes, or share no task.
pub fn compare(baseline: &SuiteResult, candidate: &SuiteResult) -> Result<Comparison, EvalError> {
    let differ = |what: &str, a: &str, b: &str| {
        Err(EvalError::Incomparable(format!(
            "the two evaluations are of different {what}: `{a}` (baseline) and `{b}`"
        )))
    };
    if baseline.suite != candidate.suite {
        return differ("suites", &baseline.suite, &candidate.suite);
    }
    if baseline.target != candidate.target {
        return differ("tools under study", &baseline.target, &candidate.target);
    }
    let judged = |r: &SuiteResult| -> BTreeMap<String, TaskResult> {
        r.tasks
            .iter()
            .filter(|t| t.infra_failure.is_none())
            .map(|t| (t.task_id.clone(), t.clone()))
            .collect()
    };
    let (a, b) = (judged(baseline), judged(candidate));
    let pairs: Vec<(&TaskResult, &TaskResult)> = a
        .iter()
        .filter_map(|(k, x)| b.get(k).map(|y| (x, y)))
        .collect();
    if pairs.is_empty() {
        return Err(EvalError::Incomparable(
            "the two evaluations share no judged task: run them on the same split (or --task list)"
                .into(),
        ));
    }
    let all_ids: std::collections::BTreeSet<&String> = baseline
        .tasks
        .iter()
        .chain(&candidate.tasks)
        .map(|t| &t.task_id)
        .collect();
    let target = baseline.target.as_str();
    let full = baseline.mode == Mode::Full && candidate.mode == Mode::Full;
    let success = if full {
        let bools: Vec<(bool, bool)> = pairs.iter().map(|(x, y)| (x.success, y.success)).collect();
        let p = mcnemar_exact(bools.iter().copied());
        let n = bools.len() as u64;
        let rate =
            |f: fn(&(bool, bool)) -> bool| bools.iter().filter(|b| f(b)).count() as f64 / n as f64;
        Some(MeasureDelta {
            tasks: n,
            baseline: rate(|b| b.0),
            candidate: rate(|b| b.1),
            better: p.only_b,
            worse: p.only_a,
            p_value: p.p_value,
            test: "mcnemar_exact",
        })
    } else {
        None
    };
    let off_target = |t: &TaskResult| t.owner.as_deref().is_some_and(|o| o != target);
    Ok(Comparison {
        suite: baseline.suite.clone(),
        tasks: pairs.len() as u64,
        unpaired: (all_ids.len() - pairs.len()) as u64,
        success,
        expected_success: permutation(&pairs, |t| t.expected_success.as_ref().map(|e| e.value))?,
        routing: permutation(&pairs, |t| t.routing_probability)?,
        selection: permutation(&pairs, |t| {
            t.first_call_probabilities.as_ref()?.get(target).copied()
        })?,
        off_target_selection: {
            let off: Vec<(&TaskResult, &TaskResult)> = pairs
                .iter()
                .copied()
                .filter(|(x, _)| off_target(x))
                .collect();
            permutation(&off, |t| {
                t.first_call_probabilities.as_ref()?.get(target).copied()
            })?
        },
    })
}

/// The paired permutation test of a per-task measure, when every pair carries it on both sides.
fn permutation(
    pairs: &[(&TaskResult, &TaskResult)],
    measure: impl Fn(&TaskResult) -> Option<f64>,
) -> Result<Option<MeasureDelta>, EvalError> {
    let values: Option<Vec<(f64, f64)>> = pairs
        .iter()
        .map(|(x, y)| Some((measure(x)?, measure(y)?)))
        .collect();
    let Some(values) = values.filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    // The default's fixed seed: the same two files always give the same p-value.
    let t = paired_permutation(values.iter().copied(), MonteCarlo::default())
        .map_err(|e| EvalError::Incomparable(e.to_string()))?;
    let n = values.len() as f64;
    Ok(Some(MeasureDelta {
        tasks: values.len() as u64,
        baseline: values.iter().map(|v| v.0).sum::<f64>() / n,
        candidate: values.iter().map(|v| v.1).sum::<f64>() / n,
        better: values.iter().filter(|v| v.1 > v.0).count() as u64,
        worse: values.iter().filter(|v| v.1 < v.0).count() as u64,
        p_value: t.p_value,
        test: "paired_permutation",
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evaluate::Timings;
    use tooltune_objectives::stats::Rate;

    fn task(
        id: &str,
        owner: &str,
        success: bool,
        p_docs: f64,
        expected: Option<f64>,
    ) -> TaskResult {
        let mut t = TaskResult::infrastructure_failure(id, Some(owner.into()), String::new());
        t.infra_failure = None;
        t.success = success;
        t.first_call_probabilities = Some(BTreeMap::from([
            ("docs".to_string(), p_docs),
            ("web".to_string(), 1.0 - p_docs),
        ]));
        t.routing_probability = Some(if owner == "docs" {
            p_docs
        } else {
            1.0 - p_docs
        });
        t.expected_success = expected.map(|value| crate::evaluate::ExpectedSuccess {
            value,
            unplayed: 0.0,
            branches: Vec::new(),
        });
        t
    }

    fn result(suite: &str, tasks: Vec<TaskResult>) -> SuiteResult {
        SuiteResult {
            suite: suite.into(),
            target: "docs".into(),
            mode: Mode::Full,
            tasks,
            success_rate: Rate::empty(),
            selection_rate: Rate::empty(),
            off_target_selection: Rate::empty(),
            expected_selection: None,
            routing: Rate::empty(),
            expected_routing: None,
            first_move_samples: None,
            expected_routing_interval: None,
            expected_success: None,
            expected_success_unplayed: None,
            infra_failures: 0,
            timings: Timings::default(),
            fixture: false,
            side_effect_tools: Vec::new(),
            read_only_violations: Vec::new(),
            trajectories: Vec::new(),
        }
    }

    #[test]
    fn tasks_are_paired_by_id_and_each_measure_gets_its_own_test() {
        // Ten web tasks on which the candidate routes better and wins three greedy verdicts, one docs task it
        // loses, and a task only the candidate ran.
        let mut base = vec![task("d0", "docs", true, 0.9, Some(0.9))];
        let mut cand = vec![task("d0", "docs", false, 0.8, Some(0.8))];
        for i in 0..10 {
            base.push(task(&format!("w{i}"), "web", false, 0.7, Some(0.3)));
            cand.push(task(&format!("w{i}"), "web", i < 3, 0.4, Some(0.6)));
        }
        cand.push(task("extra", "web", true, 0.1, Some(0.9)));
        let c = compare(&result("s", base), &result("s", cand)).expect("comparable");
        assert_eq!((c.tasks, c.unpaired), (11, 1));
        let s = c.success.expect("full evaluations");
        assert_eq!((s.better, s.worse, s.test), (3, 1, "mcnemar_exact"));
        assert!(
            (s.p_value - 0.625).abs() < 1e-9,
            "4 discordant, 3 to 1: {}",
            s.p_value
        );
        let e = c.expected_success.expect("both measured it");
        assert_eq!((e.better, e.worse), (10, 1));
        assert!(e.p_value < 0.01, "{e:?}");
        assert!((e.candidate - (0.8 + 6.0) / 11.0).abs() < 1e-9);
        let off = c.off_target_selection.expect("web tasks");
        assert_eq!(off.tasks, 10);
        assert!((off.baseline - 0.7).abs() < 1e-9 && (off.candidate - 0.4).abs() < 1e-9);
        assert_eq!(c.routing.expect("exact").better, 10);
    }

    #[test]
    fn a_measure_one_side_lacks_is_left_out_and_different_suites_or_no_common_task_are_errors() {
        let base = result("s", vec![task("a", "docs", true, 0.9, None)]);
        let cand = result("s", vec![task("a", "docs", true, 0.9, Some(0.9))]);
        let c = compare(&base, &cand).expect("comparable");
        assert!(c.expected_success.is_none());
        assert!(c.routing.is_some());
        let other = result("t", vec![task("a", "docs", true, 0.9, None)]);
        assert!(
            compare(&base, &other)
                .expect_err("incomparable")
                .to_string()
                .contains("different suites")
        );
        let disjoint = result("s", vec![task("b", "docs", true, 0.9, None)]);
        assert!(
            compare(&base, &disjoint)
                .expect_err("incomparable")
                .to_string()
                .contains("share no judged task")
        );
    }
}

//! The driver's pure functions: the fixed samples of tasks a run compares on, the content address of a task's
//! result, and the scores the search is given (blended with routing, or a screen's value under the objective).

use crate::DriverError;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use tooltune_evaluator::evaluate::TaskResult;
use tooltune_objectives::{Metrics, Objective, RolloutFacts};

/// A fixed sample of `n` of `tasks` (id, owner tool), balanced across owners: each owner's tasks are ordered by a
/// hash of the seed and their id, and the owners give one task in turn until `n` are taken. Returned in the
/// order given. All of them when `n` covers them.
pub fn stratified_sample(tasks: &[(String, Option<String>)], n: usize, seed: u64) -> Vec<String> {
    if n >= tasks.len() {
        return tasks.iter().map(|(id, _)| id.clone()).collect();
    }
    let mut groups: BTreeMap<Option<&str>, Vec<(Vec<u8>, usize)>> = BTreeMap::new();
    for (i, (id, owner)) in tasks.iter().enumerate() {
        let mut h = Sha256::new();
        h.update(seed.to_le_bytes());
        h.update(id.as_bytes());
        groups
            .entry(owner.as_deref())
            .or_default()
            .push((h.finalize().to_vec(), i));
    }
    for g in groups.values_mut() {
        g.sort();
        g.reverse();
    }
    let mut picked = Vec::with_capacity(n);
    while picked.len() < n {
        for g in groups.values_mut() {
            if picked.len() < n
                && let Some((_, i)) = g.pop()
            {
                picked.push(i);
            }
        }
    }
    picked.sort_unstable();
    picked.into_iter().map(|i| tasks[i].0.clone()).collect()
}

/// The content address of one task's result: with greedy decoding a rollout (and an exact screen) is a pure
/// function of the world (`world`: model, host, suite, server, tools shown), the task and the rollout index; a
/// host that samples adds its seed (`None` when greedy, so runs with different search seeds share their
/// rollouts). Equal keys may share one result across candidates, runs and demos; anything that changes one of
/// these changes the key, so nothing is invalidated by hand.
pub fn rollout_key(kind: &str, world: &str, task: &str, rollout: u32, seed: Option<u64>) -> String {
    let seed = seed.map_or_else(|| "greedy".to_string(), |s| s.to_string());
    let mut h = Sha256::new();
    // Each part length-prefixed: with a separator byte, parts that contain it could run into each other.
    for part in [kind, world, task, &rollout.to_string(), &seed] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    format!("{kind}-{}", hex::encode(h.finalize()))
}

/// Task-success scores blended with each task's routing score, `(1 - weight) x success + weight x routing`, so
/// scores stay in [0, 1] as the search requires (see `Screening::tie_break`). With `weight` w, one more success
/// outweighs any routing difference over fewer than (1 - w) / w tasks (998 at the default).
pub fn tie_broken(
    mut success: BTreeMap<String, f64>,
    routing: &BTreeMap<String, f64>,
    weight: f64,
) -> BTreeMap<String, f64> {
    let w = weight.clamp(0.0, 1.0);
    for (task, v) in success.iter_mut() {
        if let Some(r) = routing.get(task) {
            *v = (1.0 - w) * *v + w * r.clamp(0.0, 1.0);
        }
    }
    success
}

/// One task's screen score under an objective (see `Ctx::screen_candidate`).
pub fn screen_value(r: &TaskResult, objective: Objective, target: &str) -> f64 {
    let played_routed =
        tooltune_objectives::routed(r.owner.as_deref(), r.called.first().map(String::as_str));
    let v = match objective {
        Objective::TaskSuccess | Objective::Routing => r
            .routing_probability
            .unwrap_or(if played_routed { 1.0 } else { 0.0 }),
        Objective::SelectionRate => r
            .first_call_probabilities
            .as_ref()
            .and_then(|p| p.get(target).copied())
            .unwrap_or(if r.target_first { 1.0 } else { 0.0 }),
    };
    v.clamp(0.0, 1.0)
}

/// Metrics of screens: first moves only, so no success figure.
pub(crate) fn screen_metrics(facts: &[RolloutFacts]) -> Metrics {
    let mut m = Metrics::from_rollouts(facts);
    m.success = tooltune_objectives::stats::Rate::empty();
    m.mean_score = None;
    m
}

/// The objective facts of evaluated tasks, with `target` as the tool whose selection is measured.
pub(crate) fn facts_of(
    results: &[TaskResult],
    target: &str,
) -> Result<Vec<RolloutFacts>, DriverError> {
    results
        .iter()
        .map(|r| {
            let f = RolloutFacts::new(
                r.task_id.clone(),
                r.owner.clone(),
                target.to_string(),
                r.success,
                r.score,
                r.called.clone(),
            )?;
            let f = match r
                .first_call_probabilities
                .as_ref()
                .and_then(|p| p.get(target))
            {
                Some(p) => f.with_first_call_probability(p.clamp(0.0, 1.0))?,
                None => f,
            };
            Ok(match r.routing_probability {
                Some(p) => f.with_routing_probability(p.clamp(0.0, 1.0))?,
                None => f,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_validation_sample_is_fixed_by_the_seed_balanced_across_owners_and_in_suite_order() {
        let tasks: Vec<(String, Option<String>)> = (0..30)
            .map(|i| {
                let owner = match i % 3 {
                    0 => Some("search_docs".to_string()),
                    1 => Some("web_search".to_string()),
                    _ => None,
                };
                (format!("t{i:02}"), owner)
            })
            .collect();
        let a = stratified_sample(&tasks, 9, 0);
        assert_eq!(
            a,
            stratified_sample(&tasks, 9, 0),
            "the same seed, the same sample"
        );
        assert_ne!(
            a,
            stratified_sample(&tasks, 9, 1),
            "another seed, another sample"
        );
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(a, sorted, "in the suite's order");
        for owner in [Some("search_docs"), Some("web_search"), None] {
            let n = a
                .iter()
                .filter(|id| tasks.iter().any(|(t, o)| t == *id && o.as_deref() == owner))
                .count();
            assert_eq!(n, 3, "{owner:?}: {a:?}");
        }
        // A sample as large as the split is the split; an owner with few tasks gives what it has.
        assert_eq!(stratified_sample(&tasks, 30, 0).len(), 30);
        let lopsided: Vec<(String, Option<String>)> = (0..10)
            .map(|i| {
                (
                    format!("u{i}"),
                    Some(if i == 0 { "a" } else { "b" }.to_string()),
                )
            })
            .collect();
        let s = stratified_sample(&lopsided, 4, 0);
        assert_eq!(s.len(), 4);
        assert!(s.contains(&"u0".to_string()));
    }

    #[test]
    fn the_routing_tie_break_separates_equal_successes_and_never_outweighs_one() {
        let m = |v: &[(&str, f64)]| -> BTreeMap<String, f64> {
            v.iter().map(|(k, x)| (k.to_string(), *x)).collect()
        };
        let mean = |s: &BTreeMap<String, f64>| s.values().sum::<f64>() / s.len() as f64;
        let w = tooltune_optimizer::Screening::DEFAULT_TIE_BREAK;
        // Same successes on a minibatch of three: the child that routes more surely scores higher.
        let parent = tie_broken(
            m(&[("a", 1.0), ("b", 1.0), ("c", 0.0)]),
            &m(&[("a", 0.5), ("b", 0.6), ("c", 0.2)]),
            w,
        );
        let child = tie_broken(
            m(&[("a", 1.0), ("b", 1.0), ("c", 0.0)]),
            &m(&[("a", 0.7), ("b", 0.6), ("c", 0.4)]),
            w,
        );
        assert!(mean(&child) > mean(&parent));
        // One more success always wins, whatever the routing (worst case: 100 tasks at 0 against 1).
        let tasks: Vec<String> = (0..100).map(|i| format!("t{i}")).collect();
        let ones: BTreeMap<String, f64> = tasks.iter().map(|t| (t.clone(), 1.0)).collect();
        let zeros: BTreeMap<String, f64> = tasks.iter().map(|t| (t.clone(), 0.0)).collect();
        let mut better = zeros.clone();
        better.insert("t0".into(), 1.0);
        assert!(mean(&tie_broken(better, &zeros, w)) > mean(&tie_broken(zeros.clone(), &ones, w)));
        // A task without a routing score keeps its success; out-of-range probabilities are clamped; every score
        // stays in [0, 1] (the search refuses others).
        let s = tie_broken(
            m(&[("a", 1.0), ("b", 0.0), ("c", 1.0)]),
            &m(&[("b", 7.0), ("c", 1.0)]),
            w,
        );
        assert_eq!(s["a"], 1.0);
        assert!((s["b"] - w).abs() < 1e-12);
        assert!(s["c"] <= 1.0 && s["c"] > 1.0 - 1e-12, "{}", s["c"]);
    }

    #[test]
    fn a_rollout_key_changes_with_every_part_and_only_with_them() {
        let base = rollout_key("rollout", "world", "task", 0, Some(7));
        assert_eq!(base, rollout_key("rollout", "world", "task", 0, Some(7)));
        assert!(base.starts_with("rollout-") && base.len() == "rollout-".len() + 64);
        let variants = [
            rollout_key("screen", "world", "task", 0, Some(7)),
            rollout_key("rollout", "world2", "task", 0, Some(7)),
            rollout_key("rollout", "world", "task2", 0, Some(7)),
            rollout_key("rollout", "world", "task", 1, Some(7)),
            rollout_key("rollout", "world", "task", 0, Some(8)),
            // A greedy host's key has no seed in it.
            rollout_key("rollout", "world", "task", 0, None),
            // Parts are separated, so moving text from one part to the next is a different key.
            rollout_key("rollout", "worldt", "ask", 0, Some(7)),
        ];
        for (i, v) in variants.iter().enumerate() {
            assert_ne!(&base, v, "variant {i}");
            for w in &variants[i + 1..] {
                assert_ne!(v, w);
            }
        }
    }
}

//! The end of a run: the seed and the best candidate evaluated on the held-out test split, both metrics with
//! intervals, paired tests between them, the winner's lineage with its diagnoses, and every candidate's figures.

use crate::{Ctx, DriverError, Event, Phase};
use std::collections::BTreeMap;
use tooltune_evaluator::Split;
use tooltune_objectives::stats::{MonteCarlo, mcnemar_exact, paired_permutation};
use tooltune_objectives::{Metrics, Objective, RolloutFacts, per_task_scores};
use tooltune_optimizer::{CandidateId, Descriptions, Search};
use tooltune_run::{Comparison, RunSummary, TaskDelta};

/// Seed against another candidate on the same tasks: both metrics, exact McNemar on per-task success, paired
/// permutation tests on selection and on `objective` (seeded, so the p-values are reproducible).
pub(crate) fn compare(
    seed: &[RolloutFacts],
    other: &[RolloutFacts],
    objective: Objective,
    rng_seed: u64,
) -> Result<Comparison, DriverError> {
    let pairs = |obj| {
        let a = per_task_scores(obj, seed);
        let b = per_task_scores(obj, other);
        a.iter()
            .filter_map(|(k, x)| b.get(k).map(|y| (*x, *y)))
            .collect::<Vec<_>>()
    };
    let mc = MonteCarlo {
        permutations: 20_000,
        seed: rng_seed,
    };
    let off_pairs = {
        let off = |v: &[RolloutFacts]| -> Vec<RolloutFacts> {
            v.iter().filter(|f| f.off_target()).cloned().collect()
        };
        let (so, wo) = (off(seed), off(other));
        let a = per_task_scores(Objective::SelectionRate, &so);
        let b = per_task_scores(Objective::SelectionRate, &wo);
        a.iter()
            .filter_map(|(k, x)| b.get(k).map(|y| (*x, *y)))
            .collect::<Vec<_>>()
    };
    let owners: std::collections::BTreeMap<&str, Option<String>> = seed
        .iter()
        .map(|f| (f.task_id(), f.owner().map(str::to_string)))
        .collect();
    let routing_deltas = {
        let a = per_task_scores(Objective::Routing, seed);
        let b = per_task_scores(Objective::Routing, other);
        a.iter()
            .filter_map(|(k, x)| {
                b.get(k).map(|y| TaskDelta {
                    task: k.clone(),
                    owner: owners.get(k.as_str()).cloned().flatten(),
                    seed: *x,
                    winner: *y,
                })
            })
            .collect::<Vec<_>>()
    };
    let success_pairs = pairs(Objective::TaskSuccess)
        .into_iter()
        .map(|(x, y)| (x >= 0.5, y >= 0.5))
        .collect::<Vec<_>>();
    Ok(Comparison {
        split: "test".into(),
        seed: Metrics::from_rollouts(seed),
        winner: Metrics::from_rollouts(other),
        success_p_value: mcnemar_exact(success_pairs).p_value,
        selection_p_value: paired_permutation(pairs(Objective::SelectionRate), mc)?.p_value,
        objective_p_value: paired_permutation(pairs(objective), mc)?.p_value,
        routing_p_value: Some(paired_permutation(pairs(Objective::Routing), mc)?.p_value),
        off_target_p_value: if off_pairs.is_empty() {
            None
        } else {
            Some(paired_permutation(off_pairs, mc)?.p_value)
        },
        routing_deltas,
    })
}

/// The held-out split as the run evaluates it: the tasks rolled out (all of them, or `test_sample` of them
/// balanced across owner tools) and the rest, screened only.
pub(crate) fn held_out_tasks(ctx: &Ctx<'_>) -> (Vec<String>, Vec<String>) {
    let all: Vec<(String, Option<String>)> = ctx
        .suite
        .split(Split::Test)
        .map(|t| (t.id.clone(), t.owner.clone()))
        .collect();
    // A catalog suite cannot roll out: every held-out task is screened.
    if ctx.suite.is_catalog() {
        return (Vec::new(), all.into_iter().map(|(id, _)| id).collect());
    }
    split_held_out(&all, ctx.cfg.test_sample, ctx.cfg.seed)
}

/// `tasks` (id, owner) cut into the rolled-out sample and the screened rest, both in suite order.
pub fn split_held_out(
    tasks: &[(String, Option<String>)],
    sample: Option<usize>,
    seed: u64,
) -> (Vec<String>, Vec<String>) {
    let rolled = match sample {
        Some(n) if n < tasks.len() => crate::stratified_sample(tasks, n.max(1), seed),
        _ => tasks.iter().map(|(id, _)| id.clone()).collect(),
    };
    let rest = tasks
        .iter()
        .map(|(id, _)| id.clone())
        .filter(|id| !rolled.contains(id))
        .collect();
    (rolled, rest)
}

/// One candidate on the held-out split: the facts of its rollouts and of its screens.
#[derive(Debug, Clone)]
pub(crate) struct HeldOut {
    rolled: Vec<RolloutFacts>,
    screened: Vec<RolloutFacts>,
}

async fn held_out(
    ctx: &Ctx<'_>,
    descriptions: &Descriptions,
    rolled: &[String],
    screened: &[String],
) -> Result<HeldOut, DriverError> {
    let results = ctx.results(descriptions, rolled).await?;
    let screens = if screened.is_empty() {
        Vec::new()
    } else {
        let s = ctx.screens(descriptions, screened).await?;
        screened.iter().filter_map(|t| s.get(t).cloned()).collect()
    };
    Ok(HeldOut {
        rolled: ctx.facts(&results)?,
        screened: ctx.facts(&screens)?,
    })
}

/// Metrics of a held-out evaluation: what only a rollout shows (success, the calls it made) from the rolled-out
/// tasks, the exact first-move figures from every task.
pub(crate) fn held_out_metrics(h: &HeldOut) -> Metrics {
    let played = Metrics::from_rollouts(&h.rolled);
    if h.screened.is_empty() {
        return played;
    }
    let all: Vec<RolloutFacts> = h.rolled.iter().chain(&h.screened).cloned().collect();
    let exact = Metrics::from_rollouts(&all);
    Metrics {
        tasks: exact.tasks,
        expected: exact.expected,
        expected_routing: exact.expected_routing,
        ..played
    }
}

/// [`compare`] over a held-out evaluation whose rest was screened: task success and the played rates on the
/// rolled-out tasks; the tests on first-move measures over every task, screened ones included, since their exact
/// probabilities are the same whether or not a rollout followed.
pub(crate) fn compare_held_out(
    seed: &HeldOut,
    other: &HeldOut,
    objective: Objective,
    rng_seed: u64,
) -> Result<Comparison, DriverError> {
    if seed.screened.is_empty() {
        return compare(&seed.rolled, &other.rolled, objective, rng_seed);
    }
    let all = |h: &HeldOut| -> Vec<RolloutFacts> {
        h.rolled.iter().chain(&h.screened).cloned().collect()
    };
    // Screened facts carry exact probabilities and no outcome: every test on them reads the probabilities.
    let exact = compare(&all(seed), &all(other), objective, rng_seed)?;
    let played = compare(&seed.rolled, &other.rolled, objective, rng_seed)?;
    Ok(Comparison {
        seed: held_out_metrics(seed),
        winner: held_out_metrics(other),
        success_p_value: played.success_p_value,
        objective_p_value: if objective == Objective::TaskSuccess {
            played.objective_p_value
        } else {
            exact.objective_p_value
        },
        ..exact
    })
}

pub(crate) async fn finish(ctx: &Ctx<'_>, search: &Search) -> Result<RunSummary, DriverError> {
    let seed = search
        .candidate(CandidateId(0))
        .ok_or_else(|| DriverError::Config("the search has no seed candidate".into()))?;
    let best = search.best().unwrap_or(seed);
    let (rolled, screened) = held_out_tasks(ctx);
    let spent = search.spent().rollouts;
    ctx.emit(Event::Evaluating {
        candidate: seed.id.0,
        phase: Phase::Test,
        tasks: rolled.len(),
    })
    .await?;
    let seed_held = held_out(ctx, &seed.descriptions, &rolled, &screened).await?;
    let best_held = if best.id == seed.id {
        seed_held.clone()
    } else {
        ctx.emit(Event::Evaluating {
            candidate: best.id.0,
            phase: Phase::Test,
            tasks: rolled.len(),
        })
        .await?;
        held_out(ctx, &best.descriptions, &rolled, &screened).await?
    };
    let objective = ctx.cfg.objective;
    let test = compare_held_out(&seed_held, &best_held, objective, ctx.cfg.seed)?;
    ctx.emit(Event::Evaluated {
        candidate: best.id.0,
        phase: Phase::Test,
        mean: test.winner.headline(objective).unwrap_or(0.0),
        metrics: Box::new(test.winner.clone()),
        rollouts_spent: spent,
        screened_spent: search.spent().screened,
    })
    .await?;

    let validation_tasks = search.validation_tasks().to_vec();
    let mut validation = BTreeMap::new();
    for c in search.candidates() {
        if c.validation_mean.is_none() {
            continue;
        }
        let metrics = if ctx.decisive() {
            // Validated by screens: their figures, with no success rate (nothing was rolled out).
            let s = ctx.screens(&c.descriptions, &validation_tasks).await?;
            let ordered: Vec<_> = validation_tasks
                .iter()
                .filter_map(|t| s.get(t).cloned())
                .collect();
            crate::screen_metrics(&ctx.facts(&ordered)?)
        } else {
            let r = ctx.results(&c.descriptions, &validation_tasks).await?;
            Metrics::from_rollouts(&ctx.facts(&r)?)
        };
        validation.insert(c.id.0, metrics);
    }
    let target = &ctx.cfg.target;
    let schema = ctx
        .server_tools
        .iter()
        .find(|t| &t.name == target)
        .map(|t| &*t.input_schema);
    let candidates = tooltune_run::candidate_summaries(search, target, schema, &validation);
    let lineage = tooltune_run::lineage(search, best.id, target);
    ctx.emit(Event::Finished { best: best.id.0 }).await?;
    Ok(RunSummary {
        run_id: ctx.run_id.clone(),
        objective,
        target: ctx.cfg.target.clone(),
        stop_reason: search
            .stopped()
            .map(|r| format!("{r:?}"))
            .unwrap_or_else(|| "unknown".into()),
        spent: search.spent().clone(),
        wall_s: ctx.elapsed_ms() as f64 / 1000.0,
        winner: best.id.0,
        winner_descriptions: best.descriptions.clone(),
        lineage,
        test,
        candidates,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fact(
        task: &str,
        owner: &str,
        success: bool,
        called: &[&str],
        p_target: f64,
    ) -> RolloutFacts {
        let routed = if owner == "docs" {
            p_target
        } else {
            1.0 - p_target
        };
        RolloutFacts::new(
            task,
            Some(owner.to_string()),
            "docs",
            success,
            if success { 1.0 } else { 0.0 },
            called.iter().map(|s| s.to_string()).collect(),
        )
        .and_then(|f| f.with_first_call_probability(p_target))
        .and_then(|f| f.with_routing_probability(routed))
        .expect("valid facts")
    }

    #[test]
    fn a_held_out_sample_is_balanced_and_the_rest_is_screened_in_suite_order() {
        let tasks: Vec<(String, Option<String>)> = (0..10)
            .map(|i| {
                let owner = if i < 4 { "docs" } else { "web" };
                (format!("t{i}"), Some(owner.to_string()))
            })
            .collect();
        let (rolled, rest) = split_held_out(&tasks, Some(4), 7);
        assert_eq!(rolled.len(), 4);
        assert_eq!(rest.len(), 6);
        let docs = rolled
            .iter()
            .filter(|t| tasks[..4].iter().any(|(id, _)| id == *t));
        assert_eq!(docs.count(), 2, "two of each owner: {rolled:?}");
        let mut all: Vec<&String> = rolled.iter().chain(&rest).collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 10, "every task once");
        assert!(
            rest.windows(2)
                .all(|w| w[0][1..].parse::<u32>().ok() < w[1][1..].parse().ok())
        );
        assert_eq!(
            split_held_out(&tasks, Some(4), 7),
            (rolled, rest),
            "fixed by the seed"
        );
        assert_eq!(split_held_out(&tasks, None, 7).1, Vec::<String>::new());
        assert_eq!(split_held_out(&tasks, Some(99), 7).0.len(), 10);
    }

    #[test]
    fn success_comes_from_the_rollouts_and_first_move_figures_from_every_task() {
        // Seed: 2 rolled-out tasks (one success), 2 screened; winner: both rolled-out tasks succeed, and every
        // web-owned task (screened ones included) leans further towards the target.
        let seed = HeldOut {
            rolled: vec![
                fact("a", "docs", true, &["docs"], 0.9),
                fact("b", "web", false, &["docs"], 0.6),
            ],
            screened: vec![
                fact("c", "web", false, &[], 0.2),
                fact("d", "web", false, &[], 0.3),
            ],
        };
        let winner = HeldOut {
            rolled: vec![
                fact("a", "docs", true, &["docs"], 0.95),
                fact("b", "web", true, &["web"], 0.7),
            ],
            screened: vec![
                fact("c", "web", false, &[], 0.8),
                fact("d", "web", false, &[], 0.9),
            ],
        };
        let m = held_out_metrics(&seed);
        assert_eq!(m.rollouts, 2);
        assert_eq!(m.tasks, 4);
        assert_eq!(m.success.trials, 2);
        assert_eq!(m.success.hits, 1);
        let e = m.expected.expect("exact figures");
        assert!(
            (e.all - (0.9 + 0.6 + 0.2 + 0.3) / 4.0).abs() < 1e-9,
            "{e:?}"
        );
        assert!((e.off_target.unwrap_or(0.0) - (0.6 + 0.2 + 0.3) / 3.0).abs() < 1e-9);
        let c = compare_held_out(&seed, &winner, Objective::SelectionRate, 1).expect("compares");
        assert_eq!(c.winner.success.hits, 2);
        assert_eq!(c.routing_deltas.len(), 4, "every task's routing delta");
        // McNemar over the two rolled-out tasks: one discordant pair is far from significant.
        assert!(c.success_p_value > 0.9, "{}", c.success_p_value);
        let no_screens = HeldOut {
            rolled: seed.rolled.clone(),
            screened: Vec::new(),
        };
        let c2 = compare_held_out(&no_screens, &no_screens, Objective::TaskSuccess, 1)
            .expect("compares");
        assert_eq!(c2.seed.tasks, 2);
    }
}

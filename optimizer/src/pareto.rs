//! The per-task Pareto frontier GEPA selects parents from: every candidate that is best on at least one validation
//! task and dominated by no other, weighted by the number of tasks on which it holds the best score.
//!
//! Why a frontier rather than "take the best": a candidate that solves a task nobody else solves carries a lesson
//! the best-on-average one lacks; GEPA reports +6.4 points from this choice. Sampling in proportion to tasks won
//! still favours broad candidates.

use crate::{CandidateId, Scores, TaskId};
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The frontier of a set of scored candidates.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Frontier {
    /// Candidates on the frontier, by id.
    pub members: Vec<CandidateId>,
    /// For each member, the number of tasks on which it holds the best score: its sampling weight. A task won by
    /// several members (a tie) counts for each of them, as in GEPA.
    pub wins: BTreeMap<CandidateId, u32>,
    /// The best score on each task, over all candidates given.
    pub best: BTreeMap<TaskId, f64>,
}

impl Frontier {
    /// Computes the frontier. A task a candidate was not scored on counts as worse than any score, so candidates
    /// should be scored on the same tasks (the search only passes fully validated candidates).
    ///
    /// Rule: drop every candidate dominated by another (at least as good on every task, better on one) and every
    /// exact duplicate of an earlier candidate's score vector; of the rest, keep those that hold the best score on
    /// at least one task. Every task's best score is then held by some member, because the candidate that held it
    /// is either kept or dominated by (or equal to) a kept one that holds it too.
    pub fn of<'a>(candidates: impl IntoIterator<Item = (CandidateId, &'a Scores)>) -> Frontier {
        let mut cands: Vec<(CandidateId, &Scores)> = candidates.into_iter().collect();
        cands.sort_by_key(|(id, _)| *id);
        let tasks: BTreeSet<&TaskId> = cands.iter().flat_map(|(_, s)| s.keys()).collect();
        let score = |s: &Scores, t: &TaskId| s.get(t).copied().unwrap_or(f64::NEG_INFINITY);
        let mut best: BTreeMap<TaskId, f64> = BTreeMap::new();
        for t in &tasks {
            let m = cands
                .iter()
                .map(|(_, s)| score(s, t))
                .fold(f64::NEG_INFINITY, f64::max);
            best.insert((*t).clone(), m);
        }
        // `y` knocks out `x` when it dominates it, or has the same scores and an earlier id.
        let knocks_out = |y: (CandidateId, &Scores), x: (CandidateId, &Scores)| {
            let mut strictly = false;
            for t in &tasks {
                let (sy, sx) = (score(y.1, t), score(x.1, t));
                if sy < sx {
                    return false;
                }
                strictly |= sy > sx;
            }
            strictly || y.0 < x.0
        };
        let mut members = Vec::new();
        let mut wins = BTreeMap::new();
        for &x in &cands {
            if cands.iter().any(|&y| y.0 != x.0 && knocks_out(y, x)) {
                continue;
            }
            let won = tasks.iter().filter(|t| score(x.1, t) == best[**t]).count() as u32;
            if won > 0 {
                members.push(x.0);
                wins.insert(x.0, won);
            }
        }
        Frontier {
            members,
            wins,
            best,
        }
    }

    /// Sum of the sampling weights.
    pub fn total_weight(&self) -> u64 {
        self.wins.values().map(|&w| u64::from(w)).sum()
    }

    /// Draws a member with probability proportional to the tasks it wins; `None` for an empty frontier.
    pub fn sample(&self, rng: &mut impl Rng) -> Option<CandidateId> {
        let total = self.total_weight();
        if total == 0 {
            return None;
        }
        let mut pick = rng.random_range(0..total);
        for (&id, &w) in &self.wins {
            if pick < u64::from(w) {
                return Some(id);
            }
            pick -= u64::from(w);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;

    fn scores(v: &[f64]) -> Scores {
        v.iter()
            .enumerate()
            .map(|(i, s)| (format!("t{i}"), *s))
            .collect()
    }

    fn frontier_of(rows: &[&[f64]]) -> Frontier {
        let s: Vec<Scores> = rows.iter().map(|r| scores(r)).collect();
        Frontier::of(
            s.iter()
                .enumerate()
                .map(|(i, s)| (CandidateId(i as u32), s)),
        )
    }

    fn ids(v: &[u32]) -> Vec<CandidateId> {
        v.iter().map(|&i| CandidateId(i)).collect()
    }

    #[test]
    fn specialists_stay_and_the_dominated_go() {
        // c0 is dominated by c1; c1 and c2 each win a task; c3 wins nothing although nobody dominates it.
        let f = frontier_of(&[
            &[0.0, 0.0, 1.0],
            &[1.0, 0.0, 1.0],
            &[0.0, 1.0, 1.0],
            &[0.5, 0.5, 0.5],
        ]);
        assert_eq!(f.members, ids(&[1, 2]));
        // t2 is a three-way tie at 1.0 among c0..c2; only the members count it.
        assert_eq!(
            f.wins,
            BTreeMap::from([(CandidateId(1), 2), (CandidateId(2), 2)])
        );
        assert_eq!(f.best["t0"], 1.0);
    }

    #[test]
    fn duplicates_keep_the_earliest() {
        let f = frontier_of(&[&[0.5, 1.0], &[0.5, 1.0], &[1.0, 0.0]]);
        assert_eq!(f.members, ids(&[0, 2]));
    }

    #[test]
    fn a_single_candidate_wins_everything_and_nothing_is_empty() {
        let f = frontier_of(&[&[0.0, 0.0]]);
        assert_eq!((f.members.clone(), f.total_weight()), (ids(&[0]), 2));
        let f = Frontier::of(std::iter::empty());
        assert!(f.members.is_empty());
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        assert_eq!(f.sample(&mut rng), None);
    }

    #[test]
    fn sampling_follows_tasks_won() {
        // c0 wins 3 tasks, c1 wins 1: expect about 75% c0.
        let f = frontier_of(&[&[1.0, 1.0, 1.0, 0.0], &[0.0, 0.0, 0.0, 1.0]]);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(42);
        let n = 20_000;
        let c0 = (0..n)
            .filter(|_| f.sample(&mut rng) == Some(CandidateId(0)))
            .count();
        let share = c0 as f64 / n as f64;
        assert!((share - 0.75).abs() < 0.015, "{share}");
    }

    fn matrix() -> impl Strategy<Value = Vec<Vec<f64>>> {
        // Few distinct values, so ties and duplicates are common, as with 0/1 task outcomes.
        (1usize..7, 1usize..9).prop_flat_map(|(tasks, cands)| {
            proptest::collection::vec(
                proptest::collection::vec(
                    prop_oneof![Just(0.0), Just(0.5), Just(1.0), Just(0.25)],
                    tasks,
                ),
                cands,
            )
        })
    }

    proptest! {
        #[test]
        fn frontier_invariants(m in matrix()) {
            let s: Vec<Scores> = m.iter().map(|r| scores(r)).collect();
            let all: Vec<(CandidateId, &Scores)> =
                s.iter().enumerate().map(|(i, s)| (CandidateId(i as u32), s)).collect();
            let f = Frontier::of(all.iter().copied());
            let tasks: Vec<&TaskId> = s[0].keys().collect();
            // Every task's best score (over all candidates) is held by some member.
            for t in &tasks {
                let max = s.iter().map(|c| c[*t]).fold(f64::NEG_INFINITY, f64::max);
                prop_assert_eq!(f.best[*t], max);
                prop_assert!(f.members.iter().any(|m| s[m.0 as usize][*t] == max), "task {} lost its best", t);
            }
            // No member is dominated by any candidate.
            for m in &f.members {
                let x = &s[m.0 as usize];
                for y in &s {
                    let geq = tasks.iter().all(|t| y[*t] >= x[*t]);
                    let gt = tasks.iter().any(|t| y[*t] > x[*t]);
                    prop_assert!(!(geq && gt), "member {} is dominated", m);
                }
            }
            // Weights are the tasks won, counted per (task, winning member), and every member wins something.
            let counted: u64 = tasks
                .iter()
                .map(|t| f.members.iter().filter(|m| s[m.0 as usize][*t] == f.best[*t]).count() as u64)
                .sum();
            prop_assert_eq!(f.total_weight(), counted);
            prop_assert!(f.members.iter().all(|m| f.wins[m] >= 1));
            prop_assert_eq!(f.wins.len(), f.members.len());
            // Sampling only returns members.
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(m.len() as u64);
            for _ in 0..20 {
                let pick = f.sample(&mut rng).expect("a non-empty frontier");
                prop_assert!(f.members.contains(&pick));
            }
        }
    }
}

//! Merges: a merge of two lineages is started when one is due, and tried on a balanced subsample of validation
//! tasks.

use super::{Phase, Search};
use crate::candidate::Origin;
use crate::merge::merge_options;
use crate::{CandidateId, TaskId};
use rand::Rng;
use rand::seq::SliceRandom;
use std::collections::BTreeSet;

impl Search {
    /// Starts a merge if one is available; GEPA draws among the candidates uniformly.
    pub(super) fn try_merge(&mut self) -> bool {
        self.last_found_new = false;
        let options = merge_options(&self.candidates, &self.frontier(), &self.tried_merges);
        if options.is_empty() {
            return false;
        }
        let plan = options[self.rng.random_range(0..options.len())].clone();
        self.tried_merges.insert((plan.a, plan.b, plan.ancestor));
        self.spent.merges_tried += 1;
        let tasks = self.merge_subsample(plan.a, plan.b);
        let candidate = self.add_candidate(
            plan.descriptions,
            vec![plan.a, plan.b],
            Origin::Merge {
                ancestor: plan.ancestor,
                from_a: plan.from_a,
                from_b: plan.from_b,
            },
        );
        self.phase = Phase::MergeEval {
            candidate,
            a: plan.a,
            b: plan.b,
            ancestor: plan.ancestor,
            tasks,
        };
        true
    }

    /// Validation tasks to try a merge on: drawn in turn from where `a` is better, where `b` is better and where
    /// they tie (GEPA's balanced subsample), so the trial shows whether the merge keeps both parents' strengths.
    fn merge_subsample(&mut self, a: CandidateId, b: CandidateId) -> Vec<TaskId> {
        let (va, vb) = (
            &self.candidates[a.0 as usize].validation,
            &self.candidates[b.0 as usize].validation,
        );
        let mut buckets: [Vec<TaskId>; 3] = Default::default();
        for t in &self.validation {
            let i = match va[t].partial_cmp(&vb[t]) {
                Some(std::cmp::Ordering::Greater) => 0,
                Some(std::cmp::Ordering::Less) => 1,
                _ => 2,
            };
            buckets[i].push(t.clone());
        }
        for bucket in &mut buckets {
            bucket.shuffle(&mut self.rng);
        }
        let mut picked = BTreeSet::new();
        let mut round = 0;
        while picked.len() < self.config.merge_subsample && buckets.iter().any(|b| b.len() > round)
        {
            for bucket in &buckets {
                if picked.len() < self.config.merge_subsample
                    && let Some(t) = bucket.get(round)
                {
                    picked.insert(t.clone());
                }
            }
            round += 1;
        }
        self.validation
            .iter()
            .filter(|t| picked.contains(*t))
            .cloned()
            .collect()
    }
}

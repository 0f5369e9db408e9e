//! GEPA's merge: combine two candidates from different lineages that changed different tools since a shared
//! ancestor, taking each tool's description from the side that changed it.
//!
//! Why: reflection improves one tool at a time along one lineage; two lineages that each fixed a different tool
//! can be combined without another reflection call.

use crate::candidate::{Candidate, CandidateStatus};
use crate::{CandidateId, Descriptions, Frontier};
use std::collections::BTreeSet;

/// A merge the search may try.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MergePlan {
    pub a: CandidateId,
    pub b: CandidateId,
    pub ancestor: CandidateId,
    pub descriptions: Descriptions,
    pub from_a: Vec<String>,
    pub from_b: Vec<String>,
}

/// Every ancestor of a candidate (not itself). Candidates are indexed by id.
fn ancestors(cands: &[Candidate], id: CandidateId) -> BTreeSet<CandidateId> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![id];
    while let Some(c) = stack.pop() {
        for &p in &cands[c.0 as usize].parents {
            if seen.insert(p) {
                stack.push(p);
            }
        }
    }
    seen
}

/// All merges available now, in a deterministic order: for each pair of frontier members (a < b) where neither
/// descends from the other, each shared pooled ancestor such that
/// - the triple was not tried before,
/// - the ancestor's mean validation score is no higher than either member's (GEPA: merging back towards a better
///   ancestor is pointless),
/// - at least one tool was changed by exactly one of the two (otherwise there is nothing to combine),
/// - and the combination is not a candidate already made.
pub(crate) fn merge_options(
    cands: &[Candidate],
    frontier: &Frontier,
    tried: &BTreeSet<(CandidateId, CandidateId, CandidateId)>,
) -> Vec<MergePlan> {
    let mean = |id: CandidateId| {
        cands[id.0 as usize]
            .validation_mean
            .unwrap_or(f64::NEG_INFINITY)
    };
    let mut out = Vec::new();
    for (i, &a) in frontier.members.iter().enumerate() {
        for &b in &frontier.members[i + 1..] {
            let (anc_a, anc_b) = (ancestors(cands, a), ancestors(cands, b));
            if anc_a.contains(&b) || anc_b.contains(&a) {
                continue;
            }
            for &anc in anc_a.intersection(&anc_b) {
                if tried.contains(&(a, b, anc))
                    || cands[anc.0 as usize].status != CandidateStatus::InPool
                    || mean(anc) > mean(a)
                    || mean(anc) > mean(b)
                {
                    continue;
                }
                let Some(plan) = combine(cands, a, b, anc, mean(a) >= mean(b)) else {
                    continue;
                };
                if cands.iter().any(|c| c.descriptions == plan.descriptions) {
                    continue;
                }
                out.push(plan);
            }
        }
    }
    out
}

/// Tool by tool: a tool changed by one side only comes from that side; changed by both differently, from the
/// better one (`a_better`); unchanged or changed alike, as it is. `None` when no tool was changed by exactly one
/// side.
fn combine(
    cands: &[Candidate],
    a: CandidateId,
    b: CandidateId,
    anc: CandidateId,
    a_better: bool,
) -> Option<MergePlan> {
    let (da, db, d0) = (
        &cands[a.0 as usize].descriptions,
        &cands[b.0 as usize].descriptions,
        &cands[anc.0 as usize].descriptions,
    );
    let mut descriptions = Descriptions::new();
    let (mut from_a, mut from_b) = (Vec::new(), Vec::new());
    let mut one_sided = false;
    for (tool, ta) in da {
        let tb = db.get(tool).unwrap_or(ta);
        let t0 = d0.get(tool).unwrap_or(ta);
        let take_a = if ta == tb {
            true
        } else if ta == t0 {
            one_sided = true;
            false
        } else if tb == t0 {
            one_sided = true;
            true
        } else {
            a_better
        };
        if ta != tb {
            if take_a {
                from_a.push(tool.clone())
            } else {
                from_b.push(tool.clone())
            }
        }
        descriptions.insert(tool.clone(), if take_a { ta.clone() } else { tb.clone() });
    }
    one_sided.then_some(MergePlan {
        a,
        b,
        ancestor: anc,
        descriptions,
        from_a,
        from_b,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Scores;
    use crate::candidate::Origin;

    fn cand(id: u32, parents: &[u32], x: &str, y: &str, scores: &[f64]) -> Candidate {
        let validation: Scores = scores
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("v{i}"), *s))
            .collect();
        Candidate {
            id: CandidateId(id),
            descriptions: [
                ("x".to_string(), x.to_string()),
                ("y".to_string(), y.to_string()),
            ]
            .into(),
            parents: parents.iter().map(|&p| CandidateId(p)).collect(),
            origin: Origin::Seed,
            status: CandidateStatus::InPool,
            validation_mean: Some(scores.iter().sum::<f64>() / scores.len() as f64),
            validation,
            minibatch: None,
            found_at: None,
            screen: crate::Scores::new(),
        }
    }

    fn frontier(c: &[Candidate]) -> Frontier {
        Frontier::of(c.iter().map(|c| (c.id, &c.validation)))
    }

    #[test]
    fn two_lineages_that_changed_different_tools_merge() {
        // c1 fixed x (wins v0), c2 fixed y (wins v1); the seed c0 is dominated.
        let c = vec![
            cand(0, &[], "x0", "y0", &[0.0, 0.0, 0.5]),
            cand(1, &[0], "x1", "y0", &[1.0, 0.0, 0.5]),
            cand(2, &[0], "x0", "y2", &[0.0, 1.0, 0.5]),
        ];
        let f = frontier(&c);
        assert_eq!(f.members, vec![CandidateId(1), CandidateId(2)]);
        let opts = merge_options(&c, &f, &BTreeSet::new());
        assert_eq!(opts.len(), 1);
        let m = &opts[0];
        assert_eq!(
            (m.a, m.b, m.ancestor),
            (CandidateId(1), CandidateId(2), CandidateId(0))
        );
        assert_eq!(m.descriptions["x"], "x1");
        assert_eq!(m.descriptions["y"], "y2");
        assert_eq!(
            (m.from_a.clone(), m.from_b.clone()),
            (vec!["x".to_string()], vec!["y".to_string()])
        );
        // Once tried, the triple is not offered again.
        let tried = BTreeSet::from([(CandidateId(1), CandidateId(2), CandidateId(0))]);
        assert!(merge_options(&c, &f, &tried).is_empty());
    }

    #[test]
    fn no_merge_within_a_lineage_or_without_a_one_sided_change() {
        // c2 descends from c1: same lineage.
        let c = vec![
            cand(0, &[], "x0", "y0", &[0.0, 0.0]),
            cand(1, &[0], "x1", "y0", &[1.0, 0.0]),
            cand(2, &[1], "x1", "y2", &[0.0, 1.0]),
        ];
        assert!(merge_options(&c, &frontier(&c), &BTreeSet::new()).is_empty());
        // Both changed the same tool differently and nothing else: nothing to combine.
        let c = vec![
            cand(0, &[], "x0", "y0", &[0.0, 0.0]),
            cand(1, &[0], "x1", "y0", &[1.0, 0.0]),
            cand(2, &[0], "x2", "y0", &[0.0, 1.0]),
        ];
        assert!(merge_options(&c, &frontier(&c), &BTreeSet::new()).is_empty());
    }

    #[test]
    fn a_better_ancestor_or_an_existing_combination_blocks_the_merge() {
        let better_seed = vec![
            cand(0, &[], "x0", "y0", &[0.9, 0.9, 1.0]),
            cand(1, &[0], "x1", "y0", &[1.0, 0.0, 0.0]),
            cand(2, &[0], "x0", "y2", &[0.0, 1.0, 0.0]),
        ];
        assert!(merge_options(&better_seed, &frontier(&better_seed), &BTreeSet::new()).is_empty());
        let mut c = vec![
            cand(0, &[], "x0", "y0", &[0.0, 0.0, 0.0]),
            cand(1, &[0], "x1", "y0", &[1.0, 0.0, 0.0]),
            cand(2, &[0], "x0", "y2", &[0.0, 1.0, 0.0]),
        ];
        // The combination exists already (made and rejected earlier, not on the frontier).
        let mut made = cand(3, &[1], "x1", "y2", &[0.0, 0.0, 0.0]);
        made.status = CandidateStatus::Rejected {
            score: 0.0,
            to_beat: 1.0,
        };
        c.push(made);
        let f = Frontier::of(c[..3].iter().map(|c| (c.id, &c.validation)));
        assert!(merge_options(&c, &f, &BTreeSet::new()).is_empty());
    }

    #[test]
    fn both_sides_changed_one_tool_differently_takes_the_better() {
        // Three tools would be neater, but two suffice: x changed by both, y by b only.
        let c = vec![
            cand(0, &[], "x0", "y0", &[0.0, 0.0, 0.0]),
            cand(1, &[0], "x1", "y0", &[1.0, 1.0, 0.0]),
            cand(2, &[0], "x2", "y2", &[0.0, 0.0, 1.0]),
        ];
        let opts = merge_options(&c, &frontier(&c), &BTreeSet::new());
        assert_eq!(opts.len(), 1);
        assert_eq!(opts[0].descriptions["x"], "x1", "c1 has the higher mean");
        assert_eq!(opts[0].descriptions["y"], "y2");
    }
}

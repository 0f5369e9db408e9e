//! Success in expectation over the agent's first move: which first moves to play out besides the greedy one, and
//! how their outcomes combine.
//!
//! A greedy rollout says what happens when the model takes its likeliest first move, a 0-or-1 verdict per task:
//! a description that raises the right tool from 0.3 to 0.45 changes no greedy verdict, though a host that
//! samples (most do) would now pick it half again as often. Playing out every first move the model makes with
//! some probability, and weighing each outcome by that probability, gives the success such a host expects: exact
//! for the first move, the model's own greedy turns after it.

use super::first_moves::FirstMoves;
use crate::host::ForcedMove;
use serde::{Deserialize, Serialize};

/// First moves less likely than this are not played out; their probability is reported as `unplayed`, the width
/// of the interval the expected success lies in. At 0.01 the contractor suite's tasks need two branch rollouts
/// each, not one per tool of a large server.
pub const MIN_BRANCH_PROBABILITY: f64 = 0.01;

/// One first move played out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Branch {
    /// The first move.
    pub first_move: ForcedMove,
    /// The model's probability of making it.
    pub probability: f64,
    /// Whether the rollout that followed passed the task's checks.
    pub success: bool,
    /// Whether this is the greedy rollout (the model's own likeliest move), not an imposed one.
    pub greedy: bool,
    /// The rollout's final answer.
    pub final_answer: Option<String>,
    /// The tools the rollout called, in order (the imposed one first).
    #[serde(default)]
    pub called: Vec<String>,
    /// With a fixture: whether the rollout changed its copy (each branch plays on a copy of its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed_fixture: Option<bool>,
}

/// A task's expected success.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExpectedSuccess {
    /// Σ probability × success over the moves played out: the success a host sampling the first move expects,
    /// counting moves not played as failures (a lower bound).
    pub value: f64,
    /// Probability of the first moves not played out (below [`MIN_BRANCH_PROBABILITY`], or whose rollout failed
    /// for infrastructure): the expectation lies in `[value, value + unplayed]`.
    pub unplayed: f64,
    /// The moves played out, greedy first.
    pub branches: Vec<Branch>,
}

/// Every first move as a (move, probability) pair: the tools in name order, then answering without a tool.
pub(super) fn moves_of(m: &FirstMoves) -> Vec<(ForcedMove, f64)> {
    m.tools
        .iter()
        .map(|(name, p)| (ForcedMove::Tool(name.clone()), *p))
        .chain(std::iter::once((ForcedMove::NoCall, m.no_call)))
        .collect()
}

/// The first moves to play out besides the greedy rollout's own (`greedy`): those at least
/// [`MIN_BRANCH_PROBABILITY`] likely, in [`moves_of`] order.
pub(super) fn to_play(m: &FirstMoves, greedy: &ForcedMove) -> Vec<ForcedMove> {
    moves_of(m)
        .into_iter()
        .filter(|(mv, p)| mv != greedy && *p >= MIN_BRANCH_PROBABILITY)
        .map(|(mv, _)| mv)
        .collect()
}

/// One played move's outcome: `None` when its rollout failed for infrastructure (it then counts as unplayed).
pub(super) struct Played {
    pub(super) first_move: ForcedMove,
    pub(super) outcome: Option<Outcome>,
    pub(super) greedy: bool,
}

/// What a played move's rollout did.
pub(super) struct Outcome {
    pub(super) success: bool,
    pub(super) final_answer: Option<String>,
    pub(super) called: Vec<String>,
    pub(super) changed_fixture: Option<bool>,
}

/// Combines the outcomes of the moves played with their probabilities. A move played twice counts once (the
/// greedy rollout's).
pub(super) fn combine(m: &FirstMoves, played: Vec<Played>) -> ExpectedSuccess {
    let probability = |mv: &ForcedMove| {
        moves_of(m)
            .into_iter()
            .find(|(x, _)| x == mv)
            .map_or(0.0, |(_, p)| p)
    };
    let mut branches: Vec<Branch> = Vec::new();
    let mut played = played;
    played.sort_by_key(|p| !p.greedy);
    for p in played {
        let Some(Outcome {
            success,
            final_answer,
            called,
            changed_fixture,
        }) = p.outcome
        else {
            continue;
        };
        if branches.iter().any(|b| b.first_move == p.first_move) {
            continue;
        }
        branches.push(Branch {
            probability: probability(&p.first_move),
            first_move: p.first_move,
            success,
            greedy: p.greedy,
            final_answer,
            called,
            changed_fixture,
        });
    }
    let covered: f64 = branches.iter().map(|b| b.probability).sum();
    let total: f64 = moves_of(m).iter().map(|(_, p)| p).sum();
    ExpectedSuccess {
        // `0.0 +`: an empty float sum is -0.0, which prints as "-0.000".
        value: (0.0
            + branches
                .iter()
                .filter(|b| b.success)
                .map(|b| b.probability)
                .sum::<f64>())
        .clamp(0.0, 1.0),
        // The probabilities may sum to a little under 1 (a sampled estimate counts calls of unoffered tools as
        // no candidate); what no branch covers is unplayed either way.
        unplayed: (total.max(1.0) - covered).clamp(0.0, 1.0),
        branches,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn moves(docs: f64, web: f64, none: f64) -> FirstMoves {
        FirstMoves {
            tools: BTreeMap::from([("docs".to_string(), docs), ("web".to_string(), web)]),
            no_call: none,
            routed: docs,
        }
    }

    /// A played move: its verdict (`None`: an infrastructure failure) and whether it is the greedy rollout.
    fn played(first_move: ForcedMove, success: Option<bool>, greedy: bool) -> Played {
        Played {
            first_move,
            outcome: success.map(|success| Outcome {
                success,
                final_answer: None,
                called: Vec::new(),
                changed_fixture: None,
            }),
            greedy,
        }
    }

    fn tool(n: &str) -> ForcedMove {
        ForcedMove::Tool(n.into())
    }

    #[test]
    fn every_likely_move_but_the_greedy_one_is_played_and_unlikely_ones_are_left_out() {
        let m = moves(0.5, 0.1, 0.4);
        assert_eq!(
            to_play(&m, &tool("docs")),
            [tool("web"), ForcedMove::NoCall]
        );
        assert_eq!(
            to_play(&m, &ForcedMove::NoCall),
            [tool("docs"), tool("web")]
        );
        let m = moves(0.995, 0.004, 0.001);
        assert!(to_play(&m, &tool("docs")).is_empty());
    }

    #[test]
    fn outcomes_are_weighed_by_their_moves_probabilities_and_what_was_not_played_is_the_interval() {
        let m = moves(0.5, 0.1, 0.4);
        let e = combine(
            &m,
            vec![
                played(tool("web"), Some(false), false),
                played(tool("docs"), Some(true), true),
                played(ForcedMove::NoCall, Some(true), false),
            ],
        );
        assert!((e.value - 0.9).abs() < 1e-12, "{e:?}");
        assert!(e.unplayed.abs() < 1e-12);
        assert!(e.branches[0].greedy, "greedy first");
        // An infrastructure failure leaves its move unplayed: the value counts it as a failure, the interval
        // says by how much that may be wrong.
        let e = combine(
            &m,
            vec![
                played(tool("docs"), Some(true), true),
                played(ForcedMove::NoCall, None, false),
            ],
        );
        assert!((e.value - 0.5).abs() < 1e-12);
        assert!(
            (e.unplayed - 0.5).abs() < 1e-12,
            "web (0.1) and no call (0.4)"
        );
    }

    #[test]
    fn a_move_played_twice_counts_once_as_its_greedy_rollout() {
        let m = moves(0.6, 0.3, 0.1);
        let e = combine(
            &m,
            vec![
                played(tool("docs"), Some(true), false),
                played(tool("docs"), Some(false), true),
            ],
        );
        assert_eq!(e.branches.len(), 1);
        assert!(e.value.abs() < 1e-12, "the greedy verdict: {e:?}");
        assert!((e.unplayed - 0.4).abs() < 1e-12);
    }
}

//! First moves: the exact (or sampled) probabilities of a task's first move by name, the most likely one, the
//! estimate from sampled first turns when the backend cannot score exactly, and a full result's first-move part.

use super::TaskResult;
use std::collections::BTreeMap;

/// The first-move distribution estimated from sampled first turns (`Some(name)`: a call of that tool; `None`: an
/// answer without a tool). A call of a name the request did not offer counts as a call of none of
/// the candidates, so the probabilities of the candidates and of not calling may sum to less than 1. `None`
/// when nothing was sampled.
pub fn estimate_first_move(
    names: &[String],
    firsts: &[Option<String>],
) -> Option<tooltune_llm::FirstMove> {
    if firsts.is_empty() {
        return None;
    }
    let total = firsts.len() as f64;
    let calls = firsts.iter().filter(|f| f.is_some()).count() as f64;
    let given_call = names
        .iter()
        .map(|n| {
            let k = firsts
                .iter()
                .filter(|f| f.as_deref() == Some(n.as_str()))
                .count() as f64;
            if calls > 0.0 { k / calls } else { 0.0 }
        })
        .collect();
    Some(tooltune_llm::FirstMove {
        given_call,
        p_call: calls / total,
    })
}

/// A task's exact (or estimated) first moves, by name.
#[derive(Debug, Clone)]
pub(super) struct FirstMoves {
    /// P(first move = a call of this tool).
    pub(super) tools: BTreeMap<String, f64>,
    /// P(an answer without a tool first).
    pub(super) no_call: f64,
    /// P(the right first move).
    pub(super) routed: f64,
}

impl FirstMoves {
    pub(super) fn new(names: &[String], m: &tooltune_llm::FirstMove, owner: Option<&str>) -> Self {
        let tools: BTreeMap<String, f64> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), m.p_tool(i).clamp(0.0, 1.0)))
            .collect();
        let no_call = m.p_no_call().clamp(0.0, 1.0);
        let routed = match owner {
            Some(o) => tools.get(o).copied().unwrap_or(0.0),
            None => no_call,
        };
        FirstMoves {
            tools,
            no_call,
            routed,
        }
    }
}

/// The most likely first move under exact probabilities: a tool, or `None` when answering without one is at
/// least as likely as every call.
pub(super) fn likeliest_first(p: &BTreeMap<String, f64>, no_call: Option<f64>) -> Option<String> {
    argmax(p).filter(|t| no_call.is_none_or(|n| p[t] >= n))
}

impl TaskResult {
    /// The first-move part of a full rollout's result, as a selection-only evaluation would have given it (the
    /// most likely first move as the call, no verdict), when it carries exact probabilities: the scoring that
    /// precedes every rollout is then a screen that need not be made again.
    pub fn first_move_only(&self, target: &str) -> Option<TaskResult> {
        let p = self.first_call_probabilities.as_ref()?;
        self.routing_probability?;
        let first = likeliest_first(p, self.no_call_probability);
        Some(TaskResult {
            task_id: self.task_id.clone(),
            owner: self.owner.clone(),
            success: false,
            score: 0.0,
            feedback: String::new(),
            final_answer: None,
            target_first: first.as_deref() == Some(target),
            target_called: first.as_deref() == Some(target),
            called: first.into_iter().collect(),
            first_call_probabilities: Some(p.clone()),
            no_call_probability: self.no_call_probability,
            routing_probability: self.routing_probability,
            infra_failure: None,
            trajectory_id: None,
            first_move_samples: self.first_move_samples,
            side_effect_calls: Vec::new(),
            changed_fixture: None,
            read_only_violations: Vec::new(),
            expected_success: None,
        })
    }
}

fn argmax(p: &BTreeMap<String, f64>) -> Option<String> {
    p.iter()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(k, _)| k.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["search_docs".into(), "web_search".into()]
    }

    #[test]
    fn sampled_first_moves_estimate_each_move_by_its_share() {
        let firsts = [
            Some("search_docs"),
            Some("search_docs"),
            Some("web_search"),
            None,
            Some("search_docs"),
            None,
            Some("web_search"),
            Some("search_docs"),
        ]
        .map(|f| f.map(String::from));
        let m = estimate_first_move(&names(), &firsts).expect("sampled");
        assert!((m.p_tool(0) - 4.0 / 8.0).abs() < 1e-12);
        assert!((m.p_tool(1) - 2.0 / 8.0).abs() < 1e-12);
        assert!((m.p_no_call() - 2.0 / 8.0).abs() < 1e-12);
        // A web task: its routing probability is the owner's share.
        let moves = FirstMoves::new(&names(), &m, Some("web_search"));
        assert!((moves.routed - 0.25).abs() < 1e-12);
        // The most likely move is the mode.
        assert_eq!(
            likeliest_first(&moves.tools, Some(moves.no_call)).as_deref(),
            Some("search_docs")
        );
    }

    #[test]
    fn a_call_of_an_unoffered_tool_is_no_candidate_and_nothing_sampled_is_no_estimate() {
        let firsts =
            [Some("search_docs"), Some("made_up"), None, None].map(|f| f.map(String::from));
        let m = estimate_first_move(&names(), &firsts).expect("sampled");
        assert!((m.p_tool(0) - 0.25).abs() < 1e-12);
        assert!((m.p_tool(1)).abs() < 1e-12);
        assert!((m.p_no_call() - 0.5).abs() < 1e-12);
        assert!(estimate_first_move(&names(), &[]).is_none());
        // Only answers: no call at all.
        let m = estimate_first_move(&names(), &[None, None]).expect("sampled");
        assert_eq!((m.p_call, m.p_tool(0)), (0.0, 0.0));
    }
}

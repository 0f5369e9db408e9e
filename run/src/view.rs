//! The one view of a run's candidates, built from the search's checkpoint: the driver's summary of a finished run,
//! the report of an unfinished one and the dashboard's live page all use [`candidate_summaries`], so a candidate
//! reads the same everywhere, and only this module reads the optimizer's `Search`.

use crate::summary::{CandidateSummary, Lineage, OriginKind, Status};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use tooltune_objectives::{Metrics, inflation};
use tooltune_optimizer::{CandidateId, Descriptions, Search};

/// Every candidate of a search, in order of creation. `validation` holds the validation metrics known for each
/// candidate (from the run's events, or measured again by the driver at the end); `schema` is the target tool's
/// input schema, against which scope claims are measured (`None` when unknown: every capability word not in the
/// tool's name then counts as unsupported).
pub fn candidate_summaries(
    search: &Search,
    target: &str,
    schema: Option<&Value>,
    validation: &BTreeMap<u32, Metrics>,
) -> Vec<CandidateSummary> {
    let schema = schema.unwrap_or(&Value::Null);
    search
        .candidates()
        .iter()
        .map(|c| {
            let (origin, tool, diagnosis) = OriginKind::of(&c.origin);
            let (status, trial) = Status::of(&c.status);
            let text = c.descriptions.get(target).map_or("", String::as_str);
            CandidateSummary {
                id: c.id.0,
                parents: c.parents.iter().map(|p| p.0).collect(),
                origin,
                tool,
                diagnosis,
                status,
                trial,
                descriptions: c.descriptions.clone(),
                validation_mean: c.validation_mean,
                validation: validation.get(&c.id.0).cloned(),
                found_at_rollouts: c.found_at.as_ref().map(|p| p.rollouts),
                found_at_seconds: c.found_at.as_ref().map(|p| p.elapsed_ms as f64 / 1000.0),
                found_at_reflection_tokens: c.found_at.as_ref().map(|p| p.reflection_tokens),
                inflation: inflation::measure_text(text, target, schema),
            }
        })
        .collect()
}

/// The ancestry of `leaf` from the seed, first parents only (a merge's second parent is not followed), with the
/// target tool's description at each step.
pub fn lineage(search: &Search, leaf: CandidateId, target: &str) -> Vec<Lineage> {
    let mut out = Vec::new();
    let mut cur = search.candidate(leaf);
    // Ids only grow from parent to child, so a checkpoint whose first parent does not come earlier is corrupt;
    // the bound keeps such a chain from looping.
    while let Some(c) = cur.filter(|_| out.len() <= search.candidates().len()) {
        let (origin, tool, diagnosis) = OriginKind::of(&c.origin);
        out.push(Lineage {
            candidate: c.id.0,
            origin,
            tool,
            diagnosis,
            description: c.descriptions.get(target).cloned().unwrap_or_default(),
        });
        cur = c.parents.first().and_then(|p| search.candidate(*p));
    }
    out.reverse();
    out
}

/// A search as of its last checkpoint: what it spent, where it stands and every candidate with its place on the
/// Pareto frontier. What the dashboard shows of a run in progress.
#[derive(Debug, Clone, Serialize)]
pub struct Progress {
    /// Rollouts spent.
    pub rollouts: u64,
    /// Screened task evaluations spent.
    pub screened: u64,
    /// Reflection tokens spent.
    pub reflection_tokens: u64,
    /// Iterations of the loop.
    pub iterations: u32,
    /// Reflections asked for.
    pub reflections: u32,
    /// Reflections that gave no usable description.
    pub failed_proposals: u32,
    /// Candidates that passed their trial.
    pub accepted: u32,
    /// Candidates that did not.
    pub rejected: u32,
    /// Merges tried.
    pub merges_tried: u32,
    /// The best pooled candidate so far.
    pub best: Option<u32>,
    /// Why the search stopped, once it has.
    pub stopped: Option<String>,
    /// Frontier members, by id.
    pub frontier: Vec<u32>,
    /// Every candidate, in order of creation.
    pub candidates: Vec<ProgressCandidate>,
}

/// A candidate of a search in progress: its summary and its place on the frontier.
#[derive(Debug, Clone, Serialize)]
pub struct ProgressCandidate {
    /// The candidate, as every view shows it.
    #[serde(flatten)]
    pub candidate: CandidateSummary,
    /// Whether it is on the Pareto frontier.
    pub on_frontier: bool,
    /// Validation tasks on which it holds the best score (its weight in Pareto sampling).
    pub frontier_wins: u32,
    /// Whether it is the best so far.
    pub best: bool,
}

impl Progress {
    /// The search's spending, frontier and candidates (see [`candidate_summaries`] for `target`, `schema` and
    /// `validation`).
    pub fn of(
        search: &Search,
        target: &str,
        schema: Option<&Value>,
        validation: &BTreeMap<u32, Metrics>,
    ) -> Progress {
        let frontier = search.frontier();
        let best = search.best().map(|c| c.id.0);
        let candidates = candidate_summaries(search, target, schema, validation)
            .into_iter()
            .map(|c| {
                let id = CandidateId(c.id);
                ProgressCandidate {
                    on_frontier: frontier.members.contains(&id),
                    frontier_wins: frontier.wins.get(&id).copied().unwrap_or(0),
                    best: best == Some(c.id),
                    candidate: c,
                }
            })
            .collect();
        let spent = search.spent();
        Progress {
            rollouts: spent.rollouts,
            screened: spent.screened,
            reflection_tokens: spent.reflection_tokens,
            iterations: spent.iterations,
            reflections: spent.reflections,
            failed_proposals: spent.failed_proposals,
            accepted: spent.accepted,
            rejected: spent.rejected,
            merges_tried: spent.merges_tried,
            best,
            stopped: search.stopped().map(|r| format!("{r:?}")),
            frontier: frontier.members.iter().map(|c| c.0).collect(),
            candidates,
        }
    }
}

/// A run's checkpointed search, read from the run's stored state: what the report and the dashboard know of a run
/// that has not finished. Opaque, so that the views depend on this crate's types and not on the search's.
#[derive(Debug, Clone)]
pub struct Checkpoint(Search);

impl Checkpoint {
    /// Reads a stored checkpoint (the run row's `state`).
    pub fn parse(state: &str) -> Result<Checkpoint, serde_json::Error> {
        serde_json::from_str(state).map(Checkpoint)
    }

    /// Every candidate (see [`candidate_summaries`]).
    pub fn candidates(
        &self,
        target: &str,
        schema: Option<&Value>,
        validation: &BTreeMap<u32, Metrics>,
    ) -> Vec<CandidateSummary> {
        candidate_summaries(&self.0, target, schema, validation)
    }

    /// The seed candidate's descriptions (`None` only for a corrupt checkpoint).
    pub fn seed(&self) -> Option<&Descriptions> {
        self.0.candidates().first().map(|c| &c.descriptions)
    }

    /// The best pooled candidate so far.
    pub fn best(&self) -> Option<u32> {
        self.0.best().map(|c| c.id.0)
    }

    /// The best candidate's ancestry from the seed (empty before the seed is validated).
    pub fn lineage_of_best(&self, target: &str) -> Vec<Lineage> {
        match self.0.best() {
            Some(b) => lineage(&self.0, b.id, target),
            None => Vec::new(),
        }
    }

    /// Rollouts the search has counted.
    pub fn rollouts(&self) -> u64 {
        self.0.spent().rollouts
    }

    /// Reflection tokens the search has counted.
    pub fn reflection_tokens(&self) -> u64 {
        self.0.spent().reflection_tokens
    }

    /// The search's spending, frontier and candidates (see [`Progress::of`]).
    pub fn progress(
        &self,
        target: &str,
        schema: Option<&Value>,
        validation: &BTreeMap<u32, Metrics>,
    ) -> Progress {
        Progress::of(&self.0, target, schema, validation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tooltune_optimizer::{Action, Config, Observation};

    /// A search in which the seed scores 0 and the reflector's one proposal scores 1 everywhere: the proposal
    /// passes its minibatch and is validated.
    fn one_accepted_child() -> Search {
        let seed = Descriptions::from([
            ("search_docs".to_string(), "Search the docs.".to_string()),
            ("web_search".to_string(), "Search the web.".to_string()),
        ]);
        let mut config = Config::new(["search_docs"]);
        config.budget.max_rollouts = Some(100);
        let mut search = Search::new(
            config,
            seed,
            vec!["a".into(), "b".into(), "c".into()],
            vec!["v1".into(), "v2".into()],
            1,
        )
        .expect("search");
        while search.candidates().len() < 2 || search.best().is_none_or(|b| b.id.0 != 1) {
            let obs = match search.next() {
                Action::EvaluateFull {
                    candidate, tasks, ..
                }
                | Action::EvaluateMinibatch {
                    candidate, tasks, ..
                }
                | Action::Merge {
                    candidate, tasks, ..
                } => {
                    let score = if candidate.0 == 0 { 0.0 } else { 1.0 };
                    let n = tasks.len() as u64;
                    Observation::evaluated(
                        candidate,
                        tasks.into_iter().map(|t| (t, score)).collect(),
                        n,
                        0,
                    )
                }
                Action::Reflect { .. } => Observation::proposed(
                    "Search the engineering handbook and runbooks.".into(),
                    Some("Too vague.".into()),
                    10,
                    0,
                ),
                other => panic!("unexpected action {other:?}"),
            };
            search.observe(obs).expect("observation");
        }
        search
    }

    #[test]
    fn every_view_of_a_checkpoint_shows_the_same_candidates_lineage_and_best() {
        let search = one_accepted_child();
        let mut validation = BTreeMap::new();
        validation.insert(1, Metrics::from_rollouts(&[]));
        let cands = candidate_summaries(&search, "search_docs", None, &validation);
        assert_eq!(cands.len(), 2);
        assert_eq!(
            (cands[0].origin, cands[0].status),
            (OriginKind::Seed, Status::InPool)
        );
        assert_eq!(cands[1].origin, OriginKind::Reflection);
        assert_eq!(cands[1].tool.as_deref(), Some("search_docs"));
        assert_eq!(cands[1].diagnosis.as_deref(), Some("Too vague."));
        assert_eq!(cands[1].parents, vec![0]);
        assert!(cands[0].validation.is_none() && cands[1].validation.is_some());
        assert_eq!(
            cands[1].inflation.chars,
            "Search the engineering handbook and runbooks.".len()
        );

        let steps: Vec<u32> = lineage(&search, CandidateId(1), "search_docs")
            .iter()
            .map(|l| l.candidate)
            .collect();
        assert_eq!(steps, vec![0, 1]);

        let p = Progress::of(&search, "search_docs", None, &validation);
        assert_eq!(p.best, Some(1));
        assert!(p.candidates[1].best && !p.candidates[0].best);
        assert_eq!(
            p.frontier,
            vec![1],
            "the child beats the seed on every task"
        );
        assert!(p.candidates[1].on_frontier && p.candidates[1].frontier_wins == 2);

        // The stored state read back gives the same view.
        let stored =
            Checkpoint::parse(&serde_json::to_string(&search).expect("serialises")).expect("reads");
        assert_eq!(stored.best(), Some(1));
        assert_eq!(
            stored.seed().map(|d| d["search_docs"].as_str()),
            Some("Search the docs.")
        );
        let again = stored.candidates("search_docs", None, &validation);
        assert_eq!(
            serde_json::to_value(&again).expect("json"),
            serde_json::to_value(&cands).expect("json")
        );
        assert_eq!(stored.lineage_of_best("search_docs").len(), 2);
        let json = serde_json::to_value(&p).expect("json");
        assert_eq!(
            json["candidates"][1]["status"], "in_pool",
            "flattened: {json}"
        );
        assert_eq!(json["candidates"][1]["on_frontier"], true);
    }
}

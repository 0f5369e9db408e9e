//! Screened searches against a scripted fake environment: proposals are screened (an exact, cheap measure, here
//! the same keyword score the fake's rollouts give) before any rollout. Checks that a decisive screen spends no
//! rollouts and still improves, that the margin keeps a proposal that screens worse than its parent from being
//! rolled out, that the best of k proposals is the one that goes on, and that the screen budget stops a run.

use std::collections::{BTreeMap, BTreeSet};
use tooltune_optimizer::{
    Action, Budget, CandidateId, CandidateStatus, Config, Descriptions, Observation, Scores,
    Screening, Search, StopReason, TaskId, pick_best,
};

/// A FAKE evaluator, screener and reflector. Each task needs its keyword in `search_docs`'s description. The
/// reflector returns k proposals: the first adds the keyword of a failed minibatch task, the second drops the
/// description to "A tool.", the others repeat the first with a suffix.
struct Fake {
    tasks: BTreeMap<TaskId, &'static str>,
    rollouts: u64,
    screened_tasks: u64,
    /// Candidates that were rolled out (evaluated with rollouts), in order.
    rolled_out: Vec<CandidateId>,
    last: Scores,
}

const KEYWORDS: [&str; 6] = ["billing", "runbook", "handbook", "retry", "oncall", "sdk"];

impl Fake {
    fn new() -> Self {
        let mut tasks = BTreeMap::new();
        for (i, kw) in KEYWORDS.iter().enumerate() {
            tasks.insert(format!("train-{i}"), *kw);
            tasks.insert(format!("val-{i}"), *kw);
        }
        Fake {
            tasks,
            rollouts: 0,
            screened_tasks: 0,
            rolled_out: Vec::new(),
            last: Scores::new(),
        }
    }

    fn split(&self, p: &str) -> Vec<TaskId> {
        self.tasks
            .keys()
            .filter(|t| t.starts_with(p))
            .cloned()
            .collect()
    }

    fn score(&self, d: &Descriptions, t: &str) -> f64 {
        if d["search_docs"].contains(self.tasks[t]) {
            1.0
        } else {
            0.0
        }
    }

    fn scores(&self, d: &Descriptions, tasks: &[TaskId]) -> Scores {
        tasks
            .iter()
            .map(|t| (t.clone(), self.score(d, t)))
            .collect()
    }

    fn answer(&mut self, a: &Action, decisive: bool) -> Option<Observation> {
        Some(match a {
            Action::EvaluateFull {
                candidate,
                descriptions,
                tasks,
            }
            | Action::EvaluateMinibatch {
                candidate,
                descriptions,
                tasks,
            }
            | Action::Merge {
                candidate,
                descriptions,
                tasks,
                ..
            } => {
                let s = self.scores(descriptions, tasks);
                self.last = s.clone();
                if decisive {
                    self.screened_tasks += tasks.len() as u64;
                    Observation::evaluated_by_screen(*candidate, s, tasks.len() as u64, 0)
                } else {
                    self.rollouts += tasks.len() as u64;
                    self.rolled_out.push(*candidate);
                    Observation::evaluated(*candidate, s, tasks.len() as u64, 0)
                }
            }
            Action::Reflect {
                current,
                tasks,
                proposals,
                ..
            } => {
                let missing = tasks
                    .iter()
                    .find(|t| self.last.get(*t).copied() < Some(1.0))
                    .map(|t| self.tasks[t.as_str()])
                    .unwrap_or("sdk");
                let good = format!("{current} {missing}");
                let mut out = vec![(good.clone(), Some("fake".to_string()))];
                if *proposals > 1 {
                    out.push(("A tool.".to_string(), None));
                }
                for i in 2..*proposals {
                    out.push((format!("{good} ({i})"), None));
                }
                out.truncate(*proposals);
                Observation::proposed_many(out, Vec::new(), 100, 0)
            }
            Action::Screen {
                candidates, tasks, ..
            } => {
                let scores: BTreeMap<CandidateId, Scores> = candidates
                    .iter()
                    .map(|(c, d)| (*c, self.scores(d, tasks)))
                    .collect();
                let counted = ((candidates.len() - 1) * tasks.len()) as u64;
                self.screened_tasks += counted;
                Observation::screened(scores, counted, 0)
            }
            Action::Stop(_) => return None,
        })
    }
}

fn seed() -> Descriptions {
    Descriptions::from([
        (
            "search_docs".to_string(),
            "Search the handbook.".to_string(),
        ),
        ("web_search".to_string(), "Search the web.".to_string()),
    ])
}

fn run(config: Config) -> (Search, Fake, Vec<Action>) {
    let decisive = config.screening.as_ref().is_some_and(|s| s.decisive);
    let mut f = Fake::new();
    let mut s = Search::new(config, seed(), f.split("train-"), f.split("val-"), 3).expect("valid");
    let mut log = Vec::new();
    for _ in 0..2_000 {
        let a = s.next();
        log.push(a.clone());
        match f.answer(&a, decisive) {
            Some(o) => s.observe(o).expect("the fake answers what was asked"),
            None => break,
        }
    }
    (s, f, log)
}

fn screened(decisive: bool, proposals: usize, max_screened: u64) -> Config {
    Config {
        budget: Budget {
            max_screened: Some(max_screened),
            max_rollouts: Some(200),
            ..Budget::default()
        },
        max_merges: 0,
        screening: Some(Screening {
            proposals,
            decisive,
            margin: 0.0,
            on_validation: true,
            sample: 0,
            tie_break: 0.0,
            spread: true,
        }),
        ..Config::new(["search_docs"])
    }
}

#[test]
fn a_decisive_screen_spends_no_rollouts_improves_and_stops_on_its_budget() {
    let (s, f, log) = run(screened(true, 3, 120));
    assert_eq!(log.last(), Some(&Action::Stop(StopReason::ScreenBudget)));
    assert_eq!((s.spent().rollouts, f.rollouts), (0, 0));
    assert_eq!(s.spent().screened, f.screened_tasks);
    // An iteration starts only with room for the parent's minibatch (3) and one child's gate (3 + 6 validation
    // tasks) left, so the budget is passed by no more than the other two children's gates.
    assert!(
        (120 - 3 - 9..=120 + 2 * 9).contains(&s.spent().screened),
        "{:?}",
        s.spent()
    );
    let seed_mean = s.candidates()[0].validation_mean.expect("seed validated");
    let best = s.best().expect("best").validation_mean.expect("validated");
    assert!(best > seed_mean + 0.3, "seed {seed_mean}, best {best}");
    // Every reflection asked for three proposals, and the useless one never went on.
    assert!(
        log.iter()
            .any(|a| matches!(a, Action::Reflect { proposals: 3, .. }))
    );
    assert!(
        s.candidates()
            .iter()
            .filter(|c| c.descriptions["search_docs"] == "A tool.")
            .all(|c| matches!(c.status, CandidateStatus::ScreenedOut { .. }))
    );
}

#[test]
fn with_task_success_only_proposals_within_the_margin_are_rolled_out() {
    let (s, f, _) = run(screened(false, 2, 10_000));
    assert!(s.spent().rollouts > 0 && s.spent().screened > 0);
    // "A tool." screens worse than every parent (it loses the handbook keyword) and is never rolled out.
    for c in s.candidates() {
        if c.descriptions["search_docs"] == "A tool." {
            assert!(!f.rolled_out.contains(&c.id), "{:?} was rolled out", c.id);
            assert!(matches!(c.status, CandidateStatus::ScreenedOut { .. }));
        }
    }
    let improved = s.best().expect("best").validation_mean > s.candidates()[0].validation_mean;
    assert!(improved);
}

#[test]
fn a_proposal_behind_its_parent_by_more_than_the_margin_is_screened_out_even_when_alone() {
    // With one proposal per reflection and the fake's second reply never asked for, the good proposal always
    // screens at least as well as its parent: every proposal is rolled out.
    let (s, _, _) = run(screened(false, 1, 10_000));
    assert_eq!(s.spent().screened_out, 0, "{:?}", s.spent());
}

#[test]
fn pick_best_takes_the_highest_mean_then_the_minibatch_then_the_earliest() {
    let t = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let sc = |pairs: &[(&str, f64)]| -> Scores {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    };
    let tasks = t(&["a", "b", "c"]);
    let mb = t(&["a"]);
    let mut scores = BTreeMap::new();
    scores.insert(CandidateId(1), sc(&[("a", 0.0), ("b", 1.0), ("c", 1.0)]));
    scores.insert(CandidateId(2), sc(&[("a", 1.0), ("b", 1.0), ("c", 0.0)]));
    scores.insert(CandidateId(3), sc(&[("a", 1.0), ("b", 1.0), ("c", 0.0)]));
    scores.insert(CandidateId(4), sc(&[("a", 0.5)]));
    let ids = [
        CandidateId(1),
        CandidateId(2),
        CandidateId(3),
        CandidateId(4),
    ];
    // 1, 2 and 3 tie on the mean; 2 and 3 win the minibatch; 2 is earlier. A missing score counts 0.
    assert_eq!(pick_best(&ids, &scores, &tasks, &mb).0, CandidateId(2));
    assert_eq!(pick_best(&ids[2..], &scores, &tasks, &mb).0, CandidateId(3));
    let (best, mean) = pick_best(&[CandidateId(4)], &scores, &tasks, &mb);
    assert_eq!(best, CandidateId(4));
    assert!((mean - 0.5 / 3.0).abs() < 1e-12);
}

#[test]
fn a_screened_search_resumes_from_its_serialised_state() {
    let cfg = screened(true, 3, 60);
    let (whole, _, whole_log) = run(cfg.clone());
    // Interrupt after a few actions, serialise, and continue.
    let mut f = Fake::new();
    let mut s = Search::new(cfg, seed(), f.split("train-"), f.split("val-"), 3).expect("valid");
    let mut log = Vec::new();
    for _ in 0..5 {
        let a = s.next();
        log.push(a.clone());
        let o = f.answer(&a, true).expect("not stopped yet");
        s.observe(o).expect("answered");
    }
    let mut s: Search = serde_json::from_str(&serde_json::to_string(&s).expect("serialises"))
        .expect("deserialises");
    loop {
        let a = s.next();
        log.push(a.clone());
        match f.answer(&a, true) {
            Some(o) => s.observe(o).expect("answered"),
            None => break,
        }
    }
    assert_eq!(log, whole_log);
    assert_eq!(s.spent(), whole.spent());
}

#[test]
fn a_gate_screens_its_minibatch_and_one_fixed_training_sample_never_validation() {
    let mut config = screened(false, 2, 10_000);
    let sample = 4;
    config.screening = Some(Screening {
        sample,
        ..Screening::for_objective(false, 2)
    });
    let minibatch = config.minibatch_size;
    let (s, _, log) = run(config);
    let mut extras = Vec::new();
    for a in &log {
        if let Action::Screen { tasks, .. } = a {
            assert!(tasks.iter().all(|t| t.starts_with("train-")), "{tasks:?}");
            // The minibatch comes first, then the sample's tasks not already in it.
            let rest: BTreeSet<&TaskId> = tasks[minibatch.min(tasks.len())..].iter().collect();
            extras.push((tasks.len(), rest));
        }
    }
    assert!(
        extras.len() >= 2,
        "too few screens to compare: {}",
        extras.len()
    );
    let union: BTreeSet<&TaskId> = extras.iter().flat_map(|(_, r)| r.iter().copied()).collect();
    assert!(
        union.len() <= sample,
        "screened beyond one fixed sample: {union:?}"
    );
    for (n, _) in &extras {
        assert!(
            *n >= sample && *n <= sample + minibatch,
            "{n} tasks screened"
        );
    }
    assert!(s.spent().rollouts > 0);
}

mod pick_best_properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Against a brute-force reading of the rule: the chosen proposal has the highest mean screen, no other
        /// with that mean has a higher minibatch mean, and no earlier one ties it on both.
        #[test]
        fn pick_best_follows_its_rule(
            grid in proptest::collection::vec(proptest::collection::vec(0u8..=4, 5), 1..6)
        ) {
            // Scores on a coarse grid (quarters), so ties happen often.
            let tasks: Vec<TaskId> = (0..5).map(|i| format!("t{i}")).collect();
            let minibatch: Vec<TaskId> = tasks[..2].to_vec();
            let ids: Vec<CandidateId> = (1..=grid.len() as u32).map(CandidateId).collect();
            let scores: BTreeMap<CandidateId, Scores> = ids
                .iter()
                .zip(&grid)
                .map(|(c, row)| {
                    (*c, tasks.iter().cloned().zip(row.iter().map(|v| f64::from(*v) / 4.0)).collect())
                })
                .collect();
            let mean = |c: &CandidateId, over: &[TaskId]| {
                over.iter().map(|t| scores[c][t]).sum::<f64>() / over.len() as f64
            };
            let (best, m) = pick_best(&ids, &scores, &tasks, &minibatch);
            prop_assert!((m - mean(&best, &tasks)).abs() < 1e-12);
            for (i, c) in ids.iter().enumerate() {
                let (all, mb) = (mean(c, &tasks), mean(c, &minibatch));
                prop_assert!(all <= m + 1e-12, "{c:?} has a higher mean");
                if (all - m).abs() < 1e-12 {
                    prop_assert!(mb <= mean(&best, &minibatch) + 1e-12, "{c:?} wins the tie");
                    if (mb - mean(&best, &minibatch)).abs() < 1e-12 {
                        let bi = ids.iter().position(|x| *x == best).expect("chosen");
                        prop_assert!(bi <= i, "an earlier tie {c:?} was passed over");
                    }
                }
            }
        }
    }
}

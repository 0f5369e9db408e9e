//! Simulated runs of the search against a scripted fake environment (evaluator and reflector), to check the loop
//! end to end: it improves a synthetic objective, stops on its budget, is deterministic, resumes from a
//! serialised state, and merges lineages within its cap.

use std::collections::BTreeMap;
use tooltune_optimizer::{
    Action, Budget, CandidateId, CandidateStatus, Config, Descriptions, Observation, Origin,
    Scores, Search, StopReason, TaskId,
};

const ROLLOUTS_PER_TASK: u64 = 2;
const MS_PER_ROLLOUT: u64 = 1_000;
const MS_PER_REFLECTION: u64 = 4_000;
const TOKENS_PER_REFLECTION: u64 = 150;

/// A FAKE evaluator and reflector. Each task belongs to a tool and needs one keyword; a task scores 1 when its
/// tool's description mentions the keyword, else 0. The fake reflector reads the parent's minibatch scores and
/// adds the keyword of one failed task of the tool it is asked about (every third time it rewrites the description
/// down to that keyword alone); every fourth proposal it instead writes a useless description (which the minibatch
/// must reject), and every seventh reply "does not parse".
struct FakeEnvironment {
    tasks: BTreeMap<TaskId, (&'static str, &'static str)>,
    last_scores: Scores,
    proposals: u32,
    rollouts: u64,
    elapsed_ms: u64,
}

const TOOLS: [&str; 2] = ["search_docs", "web_search"];
const KEYWORDS: [(&str, &str); 12] = [
    ("search_docs", "handbook"),
    ("search_docs", "billing"),
    ("search_docs", "runbook"),
    ("search_docs", "sync_orders"),
    ("search_docs", "retry"),
    ("search_docs", "oncall"),
    ("web_search", "weather"),
    ("web_search", "football"),
    ("web_search", "news"),
    ("web_search", "prices"),
    ("web_search", "flights"),
    ("web_search", "elections"),
];

impl FakeEnvironment {
    fn new() -> Self {
        let mut tasks = BTreeMap::new();
        for (i, (tool, kw)) in KEYWORDS.iter().enumerate() {
            // Two training tasks and one validation task per keyword.
            tasks.insert(format!("train-{i}a"), (*tool, *kw));
            tasks.insert(format!("train-{i}b"), (*tool, *kw));
            tasks.insert(format!("val-{i}"), (*tool, *kw));
        }
        FakeEnvironment {
            tasks,
            last_scores: Scores::new(),
            proposals: 0,
            rollouts: 0,
            elapsed_ms: 0,
        }
    }

    fn split(&self, prefix: &str) -> Vec<TaskId> {
        self.tasks
            .keys()
            .filter(|t| t.starts_with(prefix))
            .cloned()
            .collect()
    }

    fn seed() -> Descriptions {
        // The seed knows one keyword per tool.
        Descriptions::from([
            (
                "search_docs".to_string(),
                "Search the handbook.".to_string(),
            ),
            (
                "web_search".to_string(),
                "Search the web for weather.".to_string(),
            ),
            ("calculator".to_string(), "Evaluate arithmetic.".to_string()),
        ])
    }

    fn score(&self, d: &Descriptions, task: &str) -> f64 {
        let (tool, kw) = self.tasks[task];
        if d[tool].contains(kw) { 1.0 } else { 0.0 }
    }

    fn evaluate(
        &mut self,
        candidate: CandidateId,
        d: &Descriptions,
        tasks: &[TaskId],
    ) -> Observation {
        let scores: Scores = tasks
            .iter()
            .map(|t| (t.clone(), self.score(d, t)))
            .collect();
        let rollouts = ROLLOUTS_PER_TASK * tasks.len() as u64;
        self.rollouts += rollouts;
        self.elapsed_ms += rollouts * MS_PER_ROLLOUT;
        self.last_scores = scores.clone();
        Observation::evaluated(candidate, scores, rollouts, self.elapsed_ms)
    }

    fn reflect(&mut self, tool: &str, current: &str, tasks: &[TaskId]) -> Observation {
        self.proposals += 1;
        self.elapsed_ms += MS_PER_REFLECTION;
        if self.proposals.is_multiple_of(7) {
            return Observation::proposal_failed(
                "no DESCRIPTION: line".into(),
                TOKENS_PER_REFLECTION,
                self.elapsed_ms,
            );
        }
        if self.proposals.is_multiple_of(4) {
            return Observation::proposed(
                "A tool.".into(),
                None,
                TOKENS_PER_REFLECTION,
                self.elapsed_ms,
            );
        }
        let missing = tasks
            .iter()
            .filter(|t| self.last_scores[*t] < 1.0)
            .map(|t| self.tasks[t.as_str()])
            .find(|(owner, _)| *owner == tool);
        let text = match missing {
            // A rewrite that forgets what the description knew: lineages then trade tasks off against each
            // other, which is what the Pareto frontier and merges are for.
            Some((_, kw)) if self.proposals.is_multiple_of(3) => format!("Covers {kw} only."),
            Some((_, kw)) => format!("{current} Also {kw}."),
            None => current.to_string(),
        };
        Observation::proposed(
            text,
            Some("fake diagnosis".into()),
            TOKENS_PER_REFLECTION,
            self.elapsed_ms,
        )
    }

    /// Answers one action; `None` on Stop.
    fn answer(&mut self, action: &Action) -> Option<Observation> {
        Some(match action {
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
            } => self.evaluate(*candidate, descriptions, tasks),
            Action::Reflect {
                tool,
                current,
                tasks,
                ..
            } => self.reflect(tool, current, tasks),
            Action::Screen { .. } => panic!("a search without screening never asks for a screen"),
            Action::Stop(_) => return None,
        })
    }
}

fn start(config: Config, seed: u64) -> (Search, FakeEnvironment) {
    let env = FakeEnvironment::new();
    let s = Search::new(
        config,
        FakeEnvironment::seed(),
        env.split("train-"),
        env.split("val-"),
        seed,
    )
    .expect("valid search");
    (s, env)
}

/// Runs to the end (or `max_steps` actions), returning every action handed out.
fn drive(s: &mut Search, env: &mut FakeEnvironment, max_steps: usize) -> Vec<Action> {
    let mut log = Vec::new();
    for _ in 0..max_steps {
        let a = s.next();
        log.push(a.clone());
        match env.answer(&a) {
            Some(obs) => s.observe(obs).expect("the fake answers what was asked"),
            None => break,
        }
    }
    log
}

fn config(max_rollouts: u64) -> Config {
    Config {
        budget: Budget {
            max_rollouts: Some(max_rollouts),
            ..Budget::default()
        },
        max_merges: 2,
        ..Config::new(TOOLS)
    }
}

#[test]
fn the_loop_improves_the_objective_and_stops_on_budget() {
    let (mut s, mut env) = start(config(300), 1);
    let log = drive(&mut s, &mut env, 10_000);
    assert_eq!(log.last(), Some(&Action::Stop(StopReason::RolloutBudget)));
    let seed_mean = s.candidates()[0].validation_mean.expect("seed validated");
    let best = s.best().expect("a best candidate");
    let best_mean = best.validation_mean.expect("validated");
    assert!((seed_mean - 2.0 / 12.0).abs() < 1e-12, "{seed_mean}");
    assert!(
        best_mean >= seed_mean + 0.25,
        "seed {seed_mean}, best {best_mean}"
    );
    // The tool not under study is never touched.
    assert!(
        s.candidates()
            .iter()
            .all(|c| c.descriptions["calculator"] == "Evaluate arithmetic.")
    );
    // Budget accounting matches what the fake spent, and the overshoot is at most one full validation.
    let spent = s.spent();
    assert_eq!(
        (spent.rollouts, spent.elapsed_ms),
        (env.rollouts, env.elapsed_ms)
    );
    assert_eq!(
        spent.reflection_tokens,
        u64::from(env.proposals) * TOKENS_PER_REFLECTION
    );
    assert!(
        spent.rollouts >= 300 && spent.rollouts < 300 + 12 * ROLLOUTS_PER_TASK,
        "{spent:?}"
    );
    // Useless and unparseable proposals happened and did not enter the pool.
    assert!(
        spent.rejected >= 1 && spent.failed_proposals >= 1,
        "{spent:?}"
    );
    for c in s.candidates() {
        if c.descriptions.values().any(|d| d == "A tool.") {
            assert!(matches!(
                c.status,
                CandidateStatus::Rejected { .. } | CandidateStatus::Abandoned
            ));
        }
    }
    // When the best was found is recorded, for the benchmark.
    let found = best.found_at.expect("pooled candidates record when");
    assert!(found.rollouts <= spent.rollouts && found.elapsed_ms <= spent.elapsed_ms);
    // Every accepted child beat its parent on the minibatch.
    for c in s
        .candidates()
        .iter()
        .filter(|c| c.status == CandidateStatus::InPool)
    {
        if let (Origin::Reflection { .. }, Some(trial)) = (&c.origin, &c.minibatch) {
            let child: f64 = trial.child_scores.as_ref().expect("scored").values().sum();
            assert!(child > trial.parent_scores.values().sum::<f64>());
        }
    }
}

#[test]
fn a_large_budget_reaches_the_threshold() {
    let (mut s, mut env) = start(
        Config {
            score_threshold: Some(1.0),
            ..config(100_000)
        },
        3,
    );
    let log = drive(&mut s, &mut env, 100_000);
    assert_eq!(log.last(), Some(&Action::Stop(StopReason::ScoreThreshold)));
    assert_eq!(s.best().and_then(|b| b.validation_mean), Some(1.0));
}

#[test]
fn the_same_seed_and_observations_give_the_same_actions() {
    let run = |seed| {
        let (mut s, mut env) = start(config(400), seed);
        let log = drive(&mut s, &mut env, 10_000);
        (log, serde_json::to_string(&s).expect("serialises"))
    };
    let (a, state_a) = run(5);
    let (b, state_b) = run(5);
    assert_eq!(a, b);
    assert_eq!(state_a, state_b);
    let (c, _) = run(6);
    assert_ne!(a, c, "another seed draws other parents and minibatches");
}

#[test]
fn a_resumed_search_continues_exactly_as_an_uninterrupted_one() {
    let (mut whole, mut env) = start(config(400), 9);
    let uninterrupted = drive(&mut whole, &mut env, 10_000);
    for cut in [1, 2, 5, 17, 40] {
        let (mut s, mut env) = start(config(400), 9);
        let mut log = drive(&mut s, &mut env, cut);
        // The last action was answered; persist, "crash", restore.
        let saved = serde_json::to_string(&s).expect("serialises");
        let mut restored: Search = serde_json::from_str(&saved).expect("deserialises");
        assert_eq!(restored, s);
        log.extend(drive(&mut restored, &mut env, 10_000));
        assert_eq!(log, uninterrupted, "cut after {cut} actions");
    }
    // A crash with an action in flight: the restored search hands out the same action again.
    let (mut s, mut env) = start(config(400), 9);
    drive(&mut s, &mut env, 3);
    let in_flight = s.next();
    let mut restored: Search =
        serde_json::from_str(&serde_json::to_string(&s).expect("serialises")).expect("parses");
    assert_eq!(restored.next(), in_flight);
    let obs = env.answer(&in_flight).expect("not a stop");
    restored
        .observe(obs)
        .expect("the repeated action takes its answer");
}

#[test]
fn lineages_merge_within_the_cap() {
    let mut merges = 0;
    let mut pooled_merges = 0;
    for seed in 0..20 {
        let (mut s, mut env) = start(config(600), seed);
        let log = drive(&mut s, &mut env, 10_000);
        let here: Vec<&Action> = log
            .iter()
            .filter(|a| matches!(a, Action::Merge { .. }))
            .collect();
        assert!(
            here.len() <= 2,
            "seed {seed}: {} merges over the cap",
            here.len()
        );
        assert_eq!(s.spent().merges_tried as usize, here.len());
        for a in here {
            let Action::Merge {
                candidate,
                a,
                b,
                ancestor,
                descriptions,
                tasks,
            } = a
            else {
                unreachable!()
            };
            let (da, db) = (
                &s.candidates()[a.0 as usize].descriptions,
                &s.candidates()[b.0 as usize].descriptions,
            );
            // Every tool comes from one of the parents, the merge differs from both, and shares their ancestor.
            for (tool, d) in descriptions {
                assert!(
                    d == &da[tool] || d == &db[tool],
                    "seed {seed}: {tool} from neither parent"
                );
            }
            assert!(descriptions != da && descriptions != db);
            assert!(ancestor < a && ancestor < b);
            assert!(!tasks.is_empty() && tasks.len() <= 5);
            let c = &s.candidates()[candidate.0 as usize];
            assert_eq!(c.parents, vec![*a, *b]);
            if c.status == CandidateStatus::InPool {
                pooled_merges += 1;
            }
            merges += 1;
        }
    }
    assert!(merges >= 3, "merges happened in only {merges} of 20 runs");
    assert!(pooled_merges >= 1, "no merge ever passed its subsample");
}

//! Tests of the search state machine: the seed's validation, acceptance, round-robin over tools, failed proposals,
//! refused observations, stops, budgets and minibatch epochs.

use super::*;
use crate::config::Budget;
use crate::protocol::{Action, Observation};

fn tasks(prefix: &str, n: usize) -> Vec<TaskId> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

fn seed_descriptions(tools: &[&str]) -> Descriptions {
    tools
        .iter()
        .map(|t| (t.to_string(), format!("{t} v0")))
        .collect()
}

fn search(tools: &[&str], config: impl FnOnce(Config) -> Config) -> Search {
    let c = config(Config {
        max_iterations: Some(100),
        ..Config::new(tools.iter().copied())
    });
    Search::new(c, seed_descriptions(tools), tasks("t", 6), tasks("v", 4), 7).expect("valid search")
}

/// Answers the pending evaluation with `score(task)` for every task asked, one rollout per task.
fn answer(s: &mut Search, score: impl Fn(&str) -> f64) -> Action {
    let a = s.next();
    let (candidate, tasks) = match &a {
        Action::EvaluateFull {
            candidate, tasks, ..
        }
        | Action::EvaluateMinibatch {
            candidate, tasks, ..
        }
        | Action::Merge {
            candidate, tasks, ..
        } => (*candidate, tasks.clone()),
        other => panic!("expected an evaluation, got {other:?}"),
    };
    let scores: Scores = tasks.iter().map(|t| (t.clone(), score(t))).collect();
    s.observe(Observation::evaluated(
        candidate,
        scores,
        tasks.len() as u64,
        0,
    ))
    .expect("a valid evaluation");
    a
}

fn propose(s: &mut Search, text: &str) -> String {
    let Action::Reflect { tool, .. } = s.next() else {
        panic!("expected a reflection")
    };
    s.observe(Observation::proposed(
        text.into(),
        Some("why".into()),
        10,
        0,
    ))
    .expect("a proposal is expected");
    tool
}

#[test]
fn the_seed_is_validated_first_and_next_repeats_the_pending_action() {
    let mut s = search(&["a"], |c| c);
    let first = s.next();
    assert_eq!(first, s.next(), "next is idempotent until observed");
    let Action::EvaluateFull {
        candidate,
        tasks,
        descriptions,
    } = first
    else {
        panic!("expected the seed's validation")
    };
    assert_eq!((candidate, tasks.len()), (CandidateId(0), 4));
    assert_eq!(descriptions["a"], "a v0");
    answer(&mut s, |_| 0.0);
    assert_eq!(s.best().map(|c| c.id), Some(CandidateId(0)));
    assert_eq!(s.candidates()[0].status, CandidateStatus::InPool);
}

#[test]
fn a_child_is_accepted_only_on_strict_minibatch_improvement() {
    let mut s = search(&["a"], |c| c);
    answer(&mut s, |_| 0.0);
    // Parent scores 1 on its first minibatch task only; an equal child is rejected.
    let Action::EvaluateMinibatch { tasks, .. } = s.next() else {
        panic!("parent minibatch")
    };
    assert_eq!(tasks.len(), 3);
    let first = tasks[0].clone();
    let f = first.clone();
    answer(&mut s, move |t| if t == f { 1.0 } else { 0.0 });
    propose(&mut s, "a v1");
    let f = first.clone();
    answer(&mut s, move |t| if t == f { 1.0 } else { 0.0 });
    assert_eq!(
        s.candidates()[1].status,
        CandidateStatus::Rejected {
            score: 1.0,
            to_beat: 1.0
        }
    );
    assert_eq!((s.spent().rejected, s.spent().iterations), (1, 1));
    // Next iteration: a child that gains on the minibatch goes to full validation.
    answer(&mut s, |_| 0.0);
    propose(&mut s, "a v2");
    answer(&mut s, |_| 0.5);
    let Action::EvaluateFull {
        candidate, tasks, ..
    } = s.next()
    else {
        panic!("full validation")
    };
    assert_eq!((candidate, tasks), (CandidateId(2), tasks_of(&s)));
    assert_eq!(s.candidates()[2].status, CandidateStatus::Validating);
    answer(&mut s, |_| 0.25);
    assert_eq!(s.best().map(|c| c.id), Some(CandidateId(2)));
    assert_eq!(s.spent().accepted, 1);
    assert_eq!(s.spent().since_improvement, 0);
    let trial = s.candidates()[2].minibatch.clone().expect("trial recorded");
    assert_eq!(trial.child_scores.map(|c| c.len()), Some(3));
}

fn tasks_of(s: &Search) -> Vec<TaskId> {
    s.validation_tasks().to_vec()
}

#[test]
fn tools_are_mutated_round_robin() {
    let mut s = search(&["a", "b", "c"], |c| c);
    answer(&mut s, |_| 0.0);
    let mut order = Vec::new();
    for i in 0..7 {
        answer(&mut s, |_| 0.0);
        order.push(propose(&mut s, &format!("new {i}")));
        // Alternate rejections and acceptances: the order must not depend on them.
        let accept = i % 2 == 0;
        answer(&mut s, move |_| if accept { 1.0 } else { 0.0 });
        if accept {
            answer(&mut s, |_| 0.1);
        }
    }
    assert_eq!(order, ["a", "b", "c", "a", "b", "c", "a"]);
}

#[test]
fn failed_empty_and_unchanged_proposals_are_recorded_and_cost_tokens() {
    let mut s = search(&["a"], |c| c);
    answer(&mut s, |_| 0.0);
    answer(&mut s, |_| 0.0);
    assert!(matches!(s.next(), Action::Reflect { .. }));
    s.observe(Observation::proposal_failed(
        "no DESCRIPTION: line".into(),
        40,
        0,
    ))
    .expect("a proposal is expected");
    answer(&mut s, |_| 0.0);
    propose(&mut s, "  ");
    answer(&mut s, |_| 0.0);
    propose(&mut s, " a v0 ");
    let reasons: Vec<&str> = s
        .failed_proposals()
        .iter()
        .map(|f| f.reason.as_str())
        .collect();
    assert_eq!(reasons, ["no DESCRIPTION: line", "empty", "unchanged"]);
    assert_eq!(s.spent().reflection_tokens, 60);
    assert_eq!(
        (
            s.spent().failed_proposals,
            s.spent().iterations,
            s.candidates().len()
        ),
        (3, 3, 1)
    );
}

#[test]
fn a_perfect_parent_is_not_reflected_on() {
    let mut s = search(&["a"], |c| c);
    answer(&mut s, |_| 1.0);
    answer(&mut s, |_| 1.0);
    assert!(matches!(
        s.next(),
        Action::EvaluateMinibatch {
            candidate: CandidateId(0),
            ..
        }
    ));
    assert_eq!(s.spent().skipped_perfect, 1);
    assert_eq!(s.spent().reflections, 0);
}

#[test]
fn bad_observations_are_refused_without_changing_anything() {
    let mut s = search(&["a"], |c| c);
    let obs = |scores: &[(&str, f64)], c: u32| {
        Observation::evaluated(
            CandidateId(c),
            scores.iter().map(|(t, v)| (t.to_string(), *v)).collect(),
            1,
            0,
        )
    };
    assert_eq!(s.observe(obs(&[], 0)), Err(OptimizerError::NothingPending));
    s.next();
    let before = serde_json::to_string(&s).expect("serialises");
    let full = [("v0", 0.0), ("v1", 0.0), ("v2", 0.0), ("v3", 0.0)];
    assert!(matches!(
        s.observe(obs(&full, 1)),
        Err(OptimizerError::WrongCandidate { .. })
    ));
    assert!(matches!(
        s.observe(obs(&full[..3], 0)),
        Err(OptimizerError::MissingScore { .. })
    ));
    let mut extra = full.to_vec();
    extra.push(("t0", 1.0));
    assert!(matches!(
        s.observe(obs(&extra, 0)),
        Err(OptimizerError::UnexpectedTask { .. })
    ));
    let mut bad = full;
    bad[2].1 = f64::NAN;
    assert!(matches!(
        s.observe(obs(&bad, 0)),
        Err(OptimizerError::InvalidScore { .. })
    ));
    assert_eq!(
        s.observe(Observation::proposed("x".into(), None, 1, 0)),
        Err(OptimizerError::UnexpectedOutcome {
            expected: "an evaluation",
            got: "a proposal"
        })
    );
    assert_eq!(serde_json::to_string(&s).expect("serialises"), before);
    s.observe(obs(&full, 0)).expect("the right answer is taken");
}

#[test]
fn stop_requests_and_limits_end_the_search() {
    // A stop requested with an observation takes effect before the next action.
    let mut s = search(&["a"], |c| c);
    let Action::EvaluateFull { tasks, .. } = s.next() else {
        panic!("seed")
    };
    let scores = tasks.iter().map(|t| (t.clone(), 0.0)).collect();
    s.observe(Observation::evaluated(CandidateId(0), scores, 4, 10).with_stop_requested())
        .expect("valid");
    assert_eq!(s.next(), Action::Stop(StopReason::StopRequested));
    assert_eq!(s.next(), Action::Stop(StopReason::StopRequested));
    assert_eq!(s.stopped(), Some(StopReason::StopRequested));
    assert_eq!(
        s.observe(Observation::proposed("x".into(), None, 0, 0)),
        Err(OptimizerError::NothingPending)
    );
    // request_stop in the middle of an iteration abandons the trial candidate.
    let mut s = search(&["a"], |c| c);
    answer(&mut s, |_| 0.0);
    answer(&mut s, |_| 0.0);
    propose(&mut s, "a v1");
    s.request_stop();
    assert_eq!(s.next(), Action::Stop(StopReason::StopRequested));
    assert_eq!(s.candidates()[1].status, CandidateStatus::Abandoned);
    // Wall time is whatever the driver reports.
    let mut s = search(&["a"], |c| Config {
        budget: Budget {
            max_wall_ms: Some(1_000),
            ..Budget::default()
        },
        ..c
    });
    let Action::EvaluateFull { tasks, .. } = s.next() else {
        panic!("seed")
    };
    let scores = tasks.iter().map(|t| (t.clone(), 0.0)).collect();
    s.observe(Observation::evaluated(CandidateId(0), scores, 4, 1_000))
        .expect("valid");
    assert_eq!(s.next(), Action::Stop(StopReason::WallTime));
    assert_eq!(s.spent().elapsed_ms, 1_000);
}

#[test]
fn budgets_count_what_was_reported() {
    let mut s = search(&["a"], |c| Config {
        budget: Budget {
            max_rollouts: Some(10),
            max_reflection_tokens: Some(25),
            ..Budget::default()
        },
        ..c
    });
    answer(&mut s, |_| 0.0); // 4 rollouts
    answer(&mut s, |_| 0.0); // 7
    propose(&mut s, "a v1"); // 10 tokens
    answer(&mut s, |_| 0.0); // 10 rollouts: rejected, budget reached
    assert_eq!((s.spent().rollouts, s.spent().reflection_tokens), (10, 10));
    assert_eq!(s.next(), Action::Stop(StopReason::RolloutBudget));
    let mut s = search(&["a"], |c| Config {
        budget: Budget {
            max_reflection_tokens: Some(20),
            ..Budget::default()
        },
        ..c
    });
    answer(&mut s, |_| 0.0);
    answer(&mut s, |_| 0.0);
    propose(&mut s, "a new 0");
    answer(&mut s, |_| 0.0);
    answer(&mut s, |_| 0.0);
    propose(&mut s, "a new 1");
    // The second proposal spends the last tokens: the run stops before even trying the child.
    assert_eq!(s.spent().reflection_tokens, 20);
    assert_eq!(s.next(), Action::Stop(StopReason::TokenBudget));
    assert_eq!(s.candidates()[2].status, CandidateStatus::Abandoned);
}

#[test]
fn no_iteration_is_started_that_the_rollouts_left_cannot_bring_to_a_decision() {
    // Seed 4 rollouts, then an iteration of 3 + 3 whose child is rejected: 10 spent. An iteration needs 6.
    for (budget, starts) in [(15, false), (16, true)] {
        let mut s = search(&["a"], |c| Config {
            budget: Budget {
                max_rollouts: Some(budget),
                ..Budget::default()
            },
            ..c
        });
        answer(&mut s, |_| 0.0);
        answer(&mut s, |_| 0.0);
        propose(&mut s, "a v1");
        answer(&mut s, |_| 0.0);
        assert_eq!(s.spent().rollouts, 10);
        let next = s.next();
        if starts {
            assert!(
                matches!(next, Action::EvaluateMinibatch { .. }),
                "budget {budget}: {next:?}"
            );
        } else {
            // Not a parent minibatch thrown away when the budget ends before the child's.
            assert_eq!(
                next,
                Action::Stop(StopReason::RolloutBudget),
                "budget {budget}"
            );
            assert_eq!(s.spent().rollouts, 10);
        }
    }
}

#[test]
fn patience_threshold_and_iteration_cap() {
    let mut s = search(&["a"], |c| Config {
        patience: Some(2),
        ..c
    });
    answer(&mut s, |_| 0.0);
    for i in 0..2 {
        answer(&mut s, |_| 0.0);
        propose(&mut s, &format!("a new {i}"));
        answer(&mut s, |_| 0.0);
    }
    assert_eq!(s.next(), Action::Stop(StopReason::Patience));
    let mut s = search(&["a"], |c| Config {
        score_threshold: Some(0.5),
        ..c
    });
    answer(&mut s, |_| 0.5);
    assert_eq!(s.next(), Action::Stop(StopReason::ScoreThreshold));
    let mut s = search(&["a"], |c| Config {
        max_iterations: Some(1),
        ..c
    });
    answer(&mut s, |_| 1.0);
    answer(&mut s, |_| 1.0); // perfect: skipped, still an iteration
    assert_eq!(s.next(), Action::Stop(StopReason::MaxIterations));
}

#[test]
fn construction_checks_tools_and_splits() {
    let c = Config {
        max_iterations: Some(1),
        ..Config::new(["a", "zzz"])
    };
    let e = Search::new(
        c,
        seed_descriptions(&["a"]),
        tasks("t", 2),
        tasks("v", 2),
        1,
    );
    assert_eq!(e, Err(OptimizerError::UnknownTool { tool: "zzz".into() }));
    let c = Config {
        max_iterations: Some(1),
        ..Config::new(["a"])
    };
    let e = Search::new(
        c.clone(),
        seed_descriptions(&["a"]),
        vec![],
        tasks("v", 2),
        1,
    );
    assert!(matches!(
        e,
        Err(OptimizerError::InvalidTasks { split: "train", .. })
    ));
    let dup = vec!["v0".to_string(), "v0".to_string()];
    let e = Search::new(c, seed_descriptions(&["a"]), tasks("t", 2), dup, 1);
    assert!(matches!(
        e,
        Err(OptimizerError::InvalidTasks {
            split: "validation",
            ..
        })
    ));
}

#[test]
fn minibatches_walk_shuffled_epochs_without_repeats() {
    let mut s = search(&["a"], |c| Config {
        minibatch_size: 4,
        ..c
    });
    let mut seen = Vec::new();
    for _ in 0..6 {
        let b = s.next_minibatch();
        let distinct: BTreeSet<&TaskId> = b.iter().collect();
        assert_eq!((b.len(), distinct.len()), (4, 4));
        seen.extend(b);
    }
    // 24 draws over 6 tasks: every task drawn, and no task more than 5 times (epochs of 6).
    for t in s.train_tasks() {
        let n = seen.iter().filter(|x| *x == t).count();
        assert!((3..=5).contains(&n), "{t}: {n}");
    }
}

/// A search over `tools` with screening (a gate, not decisive) asking `k` proposals a reflection.
fn screened(tools: &[&str], k: usize, spread: bool) -> Search {
    search(tools, |c| Config {
        screening: Some(crate::Screening {
            spread,
            ..crate::Screening::for_objective(false, k)
        }),
        ..c
    })
}

#[test]
fn a_spread_reflection_proposes_for_each_tool_in_turn_and_each_child_rewrites_its_own_tool() {
    assert_eq!(
        (0..6)
            .map(|i| crate::proposal_tool(i, 2))
            .collect::<Vec<_>>(),
        [0, 0, 1, 1, 0, 0]
    );
    assert_eq!(crate::proposal_tool(5, 3), 2);
    let mut s = screened(&["a", "b"], 4, true);
    answer(&mut s, |_| 0.0);
    answer(&mut s, |_| 0.0);
    let Action::Reflect { tool, spread, .. } = s.next() else {
        panic!("expected a reflection")
    };
    assert_eq!(
        (tool.as_str(), spread.clone()),
        ("a", vec!["a".to_string(), "b".to_string()])
    );
    s.observe(Observation::proposed_spread(
        vec![
            ("a".into(), "a v1".into(), None),
            ("b".into(), "b v1".into(), None),
            // The same text for another tool is another proposal, not a repeat.
            ("b".into(), "a v1".into(), None),
        ],
        vec!["`a`: no usable reply".into()],
        10,
        0,
    ))
    .expect("proposals for the asked tools");
    let children = &s.candidates()[1..];
    assert_eq!(children.len(), 3);
    for (c, (tool, text)) in children
        .iter()
        .zip([("a", "a v1"), ("b", "b v1"), ("b", "a v1")])
    {
        assert_eq!(
            c.origin,
            Origin::Reflection {
                tool: tool.into(),
                diagnosis: None
            }
        );
        assert_eq!(c.descriptions[tool], text);
        let other = if tool == "a" { "b" } else { "a" };
        assert_eq!(
            c.descriptions[other],
            format!("{other} v0"),
            "only its own tool changes"
        );
    }
    assert!(matches!(s.next(), Action::Screen { .. }));
}

#[test]
fn the_spread_starts_at_the_round_robins_next_tool_and_is_off_for_one_tool_or_one_pair() {
    // Three tools, four proposals: two pairs, so two tools a round, starting where the rotation is.
    let mut s = screened(&["a", "b", "c"], 4, true);
    answer(&mut s, |_| 0.0);
    answer(&mut s, |_| 0.0);
    let Action::Reflect { spread, .. } = s.next() else {
        panic!("expected a reflection")
    };
    assert_eq!(spread, ["a", "b"]);
    s.observe(Observation::proposal_failed("none".into(), 1, 0))
        .expect("a failed reflection");
    answer(&mut s, |_| 0.0);
    let Action::Reflect { tool, spread, .. } = s.next() else {
        panic!("expected a reflection")
    };
    assert_eq!(
        (tool.as_str(), spread),
        ("b", vec!["b".to_string(), "c".to_string()])
    );
    // Two proposals make one pair: one tool, as without spreading; so do one tool, or spreading off.
    for mut s in [
        screened(&["a", "b"], 2, true),
        screened(&["a"], 4, true),
        screened(&["a", "b"], 4, false),
    ] {
        answer(&mut s, |_| 0.0);
        answer(&mut s, |_| 0.0);
        let Action::Reflect { spread, .. } = s.next() else {
            panic!("expected a reflection")
        };
        assert!(spread.is_empty(), "{spread:?}");
    }
}

#[test]
fn a_proposal_for_a_tool_not_asked_about_is_refused_without_changing_anything() {
    let mut s = screened(&["a", "b", "c"], 4, true);
    answer(&mut s, |_| 0.0);
    answer(&mut s, |_| 0.0);
    assert!(matches!(s.next(), Action::Reflect { .. }));
    let before = s.clone();
    for tools in [vec!["c"], vec!["a", "b"]] {
        let proposals = tools
            .iter()
            .map(|t| (t.to_string(), format!("{t} v1"), None))
            .collect::<Vec<_>>();
        // One proposal named with two tools, or a tool outside the spread (`c` waits for the next round).
        let mut obs = Observation::proposed_spread(proposals, Vec::new(), 10, 0);
        if tools.len() == 2 {
            let crate::Outcome::ProposedMany { proposals, .. } = &mut obs.outcome else {
                unreachable!()
            };
            proposals.pop();
        }
        let err = s.observe(obs).expect_err("refused");
        assert!(
            matches!(err, OptimizerError::WrongProposalTools { .. }),
            "{err}"
        );
        assert_eq!(s, before);
    }
}

#[test]
fn a_checkpoint_from_before_spreading_resumes_with_one_tool_a_reflection() {
    let mut s = screened(&["a", "b"], 4, true);
    answer(&mut s, |_| 0.0);
    answer(&mut s, |_| 0.0);
    let mut json: serde_json::Value = serde_json::to_value(&s).expect("serialises");
    json["config"]["screening"]
        .as_object_mut()
        .expect("screening")
        .remove("spread");
    json["phase"]
        .as_object_mut()
        .expect("phase")
        .remove("spread");
    let mut old: Search = serde_json::from_value(json).expect("an old checkpoint reads");
    let Action::Reflect { tool, spread, .. } = old.next() else {
        panic!("expected a reflection")
    };
    assert_eq!((tool.as_str(), spread.len()), ("a", 0));
    assert!(!old.config().screening.as_ref().expect("screened").spread);
}

/// Answers the pending screen with `score(descriptions)` on every task, for every candidate asked.
fn screen(s: &mut Search, score: impl Fn(&Descriptions) -> f64) -> Vec<CandidateId> {
    let Action::Screen {
        candidates, tasks, ..
    } = s.next()
    else {
        panic!("expected a screen")
    };
    let scores: std::collections::BTreeMap<CandidateId, Scores> = candidates
        .iter()
        .map(|(c, d)| (*c, tasks.iter().map(|t| (t.clone(), score(d))).collect()))
        .collect();
    s.observe(Observation::screened(
        scores,
        ((candidates.len() - 1) * tasks.len()) as u64,
        0,
    ))
    .expect("a valid screen");
    candidates.into_iter().map(|(c, _)| c).collect()
}

/// A screened two-tool search past its seed's validation and first minibatch, with the spread proposals
/// `a v1`, `a v2`, `b v1`, `b v2` (children 1 to 4) awaiting their screen.
fn spread_round(max_screened: Option<u64>) -> Search {
    let mut s = search(&["a", "b"], |c| Config {
        screening: Some(crate::Screening::for_objective(false, 4)),
        budget: Budget {
            max_screened,
            ..Budget::default()
        },
        ..c
    });
    answer(&mut s, |_| 0.0);
    answer(&mut s, |_| 0.0);
    assert!(matches!(s.next(), Action::Reflect { .. }));
    let p = |t: &str, d: &str| (t.to_string(), d.to_string(), None);
    s.observe(Observation::proposed_spread(
        vec![
            p("a", "a v1"),
            p("a", "a v2"),
            p("b", "b v1"),
            p("b", "b v2"),
        ],
        Vec::new(),
        10,
        0,
    ))
    .expect("spread proposals");
    s
}

/// Screen score of a candidate: 0.2 for the seed's texts, plus the gain listed for its text of each tool.
fn gains(a: &[(&str, f64)], b: &[(&str, f64)]) -> impl Fn(&Descriptions) -> f64 {
    let owned = |list: &[(&str, f64)]| -> Vec<(String, f64)> {
        list.iter().map(|(t, g)| (t.to_string(), *g)).collect()
    };
    let (a, b) = (owned(a), owned(b));
    move |d: &Descriptions| {
        let g = |list: &[(String, f64)], text: &str| {
            list.iter()
                .find(|(t, _)| t == text)
                .map_or(0.0, |(_, g)| *g)
        };
        0.2 + g(&a, &d["a"]) + g(&b, &d["b"])
    }
}

#[test]
fn a_spread_round_whose_two_tools_both_screen_better_has_their_best_texts_combined_and_screened() {
    let mut s = spread_round(None);
    // a v2 and b v1 are each tool's best; both beat the parent.
    let score = gains(
        &[("a v1", 0.1), ("a v2", 0.2)],
        &[("b v1", 0.15), ("b v2", 0.05)],
    );
    let first = screen(&mut s, &score);
    assert_eq!(first.len(), 5, "the parent and four proposals");
    let second = screen(&mut s, &score);
    assert_eq!(
        second,
        [CandidateId(0), CandidateId(5)],
        "the parent (cached) and the combination"
    );
    let c = s.candidates()[5].clone();
    assert_eq!(
        (c.descriptions["a"].as_str(), c.descriptions["b"].as_str()),
        ("a v2", "b v1")
    );
    assert_eq!(c.parents, [CandidateId(2), CandidateId(3)]);
    assert_eq!(
        c.origin,
        Origin::Merge {
            ancestor: CandidateId(0),
            from_a: vec!["a".into()],
            from_b: vec!["b".into()]
        }
    );
    // The combination screens best (0.55), so it is rolled out on the round's minibatch; all others are out.
    let Action::EvaluateMinibatch {
        candidate, tasks, ..
    } = s.next()
    else {
        panic!("the combination's minibatch")
    };
    assert_eq!(candidate, CandidateId(5));
    assert_eq!(Some(tasks), c.minibatch.as_ref().map(|m| m.tasks.clone()));
    for i in 1..5 {
        assert!(
            matches!(
                s.candidates()[i].status,
                CandidateStatus::ScreenedOut { .. }
            ),
            "c{i}"
        );
    }
    // Accepted and validated, it makes a merge due as a reflection child does.
    answer(&mut s, |_| 1.0);
    answer(&mut s, |_| 1.0);
    assert_eq!(s.best().map(|b| b.id), Some(CandidateId(5)));
    assert_eq!(
        s.spent().proposals,
        4,
        "the combination is not a reflector's proposal"
    );
}

#[test]
fn no_combination_when_one_tool_improves_or_the_screen_budget_cannot_pay_for_it() {
    // Only `a` beats the parent: its best goes straight to the minibatch.
    let mut s = spread_round(None);
    let score = gains(&[("a v1", 0.1)], &[("b v1", -0.1)]);
    screen(&mut s, &score);
    let Action::EvaluateMinibatch { candidate, .. } = s.next() else {
        panic!("the best proposal's minibatch")
    };
    assert_eq!((candidate, s.candidates().len()), (CandidateId(1), 5));
    // Both improve: with the budget for one more screen of the round's tasks and the child's minibatch after
    // it the combination is screened; with one screen less it is not made.
    let n = s.spent().screened / 4;
    let score = gains(&[("a v1", 0.1)], &[("b v1", 0.1)]);
    for (left, combined) in [(n + 1, true), (n, false)] {
        let mut s = spread_round(Some(4 * n + left));
        screen(&mut s, &score);
        assert_eq!(s.spent().screened, 4 * n);
        assert_eq!(
            matches!(s.next(), Action::Screen { .. }),
            combined,
            "{left} left"
        );
        assert_eq!(s.candidates().len(), 5 + combined as usize);
    }
}

#[test]
fn a_round_is_not_started_whose_gate_would_spend_the_screens_its_rollouts_need_left() {
    // A one-tool gate round screens 2 proposals on the minibatch and the sample; a round is started only if,
    // after one child's gate screen, at least one screen is left (else the child's minibatch is refused).
    let round = |max_screened: u64| {
        let mut s = search(&["a"], |c| Config {
            screening: Some(crate::Screening::for_objective(false, 1)),
            budget: Budget {
                max_screened: Some(max_screened),
                ..Budget::default()
            },
            ..c
        });
        answer(&mut s, |_| 0.0);
        s
    };
    // The gate's size: the minibatch and the sample of the six training tasks, disjoint at most.
    let gate = 3 + round(1000).screen_sample().len() as u64;
    assert_eq!(
        round(gate).next(),
        Action::Stop(StopReason::ScreenBudget),
        "exactly one gate left"
    );
    assert!(matches!(
        round(gate + 1).next(),
        Action::EvaluateMinibatch { .. }
    ));
}

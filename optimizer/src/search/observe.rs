//! Taking in results: [`Search::observe`] checks an outcome against the pending action, then takes evaluations,
//! proposals and screens, with GEPA's acceptance rule and the k-best choice among screened proposals.

use super::{Phase, Search};
use crate::candidate::{CandidateStatus, FailedProposal, MinibatchTrial, Origin};
use crate::protocol::{Observation, Outcome};
use crate::{CandidateId, OptimizerError, Scores, TaskId};
use std::collections::BTreeMap;

impl Search {
    /// Feeds back the result of the pending action. On error nothing changes.
    pub fn observe(&mut self, obs: Observation) -> Result<(), OptimizerError> {
        if !self.issued || matches!(self.phase, Phase::Stopped(_) | Phase::Idle) {
            return Err(OptimizerError::NothingPending);
        }
        self.check(&obs.outcome)?;
        // The action was issued right after the last observation: the time since is this action's.
        let since = obs.elapsed_ms.saturating_sub(self.spent.elapsed_ms);
        self.spent.elapsed_ms = self.spent.elapsed_ms.max(obs.elapsed_ms);
        self.stop_requested |= obs.stop_requested;
        match &obs.outcome {
            Outcome::Evaluated {
                rollouts, screened, ..
            } => {
                self.spent.rollouts += rollouts;
                self.spent.screened += screened;
            }
            Outcome::Screened { screened, .. } => self.spent.screened += screened,
            Outcome::Proposed {
                reflection_tokens, ..
            }
            | Outcome::ProposalFailed {
                reflection_tokens, ..
            }
            | Outcome::ProposedMany {
                reflection_tokens, ..
            } => {
                self.spent.reflection_tokens += reflection_tokens;
                self.spent.reflection_ms += since;
            }
        }
        self.issued = false;
        let phase = std::mem::replace(&mut self.phase, Phase::Idle);
        match (phase, obs.outcome) {
            (Phase::SeedEval, Outcome::Evaluated { scores, .. }) => {
                self.candidates[0].validation = scores;
                self.enter_pool(CandidateId(0));
                // Seeding is not an iteration: patience counts from here.
                self.improved_this_iteration = false;
            }
            (Phase::ParentMinibatch { parent, tasks }, Outcome::Evaluated { scores, .. }) => {
                let perfect = self
                    .config
                    .perfect_score
                    .is_some_and(|p| scores.values().all(|&s| s >= p));
                if perfect {
                    self.spent.skipped_perfect += 1;
                    self.end_iteration();
                } else {
                    let n = self.config.tools.len();
                    let tool = self.config.tools[self.next_tool % n].clone();
                    let spread = self.spread_tools();
                    self.next_tool = (self.next_tool + 1) % n;
                    self.spent.reflections += 1;
                    self.phase = Phase::Reflect {
                        parent,
                        tool,
                        tasks,
                        parent_scores: scores,
                        spread,
                    };
                }
            }
            (
                Phase::Reflect {
                    parent,
                    tool,
                    tasks,
                    parent_scores,
                    spread,
                },
                outcome,
            ) => self.take_proposals(parent, tool, spread, tasks, parent_scores, outcome),
            (
                Phase::ScreenChildren {
                    parent,
                    children,
                    minibatch,
                    tasks,
                    earlier,
                },
                Outcome::Screened { scores, .. },
            ) => self.take_screen(parent, children, earlier, minibatch, tasks, scores),
            (Phase::ChildMinibatch { child, .. }, Outcome::Evaluated { scores, .. }) => {
                if self.minibatch_trial(child, scores) {
                    self.candidates[child.0 as usize].status = CandidateStatus::Validating;
                    self.phase = Phase::FullEval {
                        candidate: child,
                        tasks: self.validation.clone(),
                    };
                }
            }
            (Phase::FullEval { candidate, .. }, Outcome::Evaluated { scores, .. }) => {
                self.candidates[candidate.0 as usize]
                    .validation
                    .extend(scores);
                self.validated(candidate);
            }
            (
                Phase::MergeEval {
                    candidate,
                    a,
                    b,
                    tasks,
                    ..
                },
                Outcome::Evaluated { scores, .. },
            ) => {
                let sum_on = |id: CandidateId| -> f64 {
                    let v = &self.candidates[id.0 as usize].validation;
                    tasks.iter().map(|t| v[t]).sum()
                };
                let to_beat = sum_on(a).max(sum_on(b));
                let score: f64 = scores.values().sum();
                self.candidates[candidate.0 as usize].validation = scores;
                if score >= to_beat {
                    self.spent.merges_accepted += 1;
                    self.merges_due = self.merges_due.saturating_sub(1);
                    let rest: Vec<TaskId> = self
                        .validation
                        .iter()
                        .filter(|t| !tasks.contains(t))
                        .cloned()
                        .collect();
                    if rest.is_empty() {
                        self.enter_pool(candidate);
                        self.end_iteration();
                    } else {
                        self.candidates[candidate.0 as usize].status = CandidateStatus::Validating;
                        self.phase = Phase::FullEval {
                            candidate,
                            tasks: rest,
                        };
                    }
                } else {
                    self.candidates[candidate.0 as usize].status =
                        CandidateStatus::Rejected { score, to_beat };
                    self.end_iteration();
                }
            }
            (phase, _) => unreachable!("`check` admitted an outcome that does not fit {phase:?}"),
        }
        Ok(())
    }

    /// A candidate's validation is complete: it joins the pool, and a reflection child makes a merge due.
    fn validated(&mut self, candidate: CandidateId) {
        self.enter_pool(candidate);
        // A reflection child, or the combination of a spread round's two best (both carry a minibatch trial; a
        // merge's child does not).
        if self.candidates[candidate.0 as usize].minibatch.is_some() {
            self.last_found_new = true;
            if self.spent.merges_tried + self.merges_due < self.config.max_merges {
                self.merges_due += 1;
            }
        }
        self.end_iteration();
    }

    /// The tools the next reflection's proposals are spread over, the round-robin's next first
    /// ([`crate::Screening::spread`]): only those that get a proposal, and none (all for the one tool) when fewer
    /// than two do.
    fn spread_tools(&self) -> Vec<String> {
        let n = self.config.tools.len();
        let k = match &self.config.screening {
            Some(sc) if sc.spread && sc.proposals > 1 => sc.proposals,
            _ => return Vec::new(),
        };
        let used = n.min(k.div_ceil(2));
        if used < 2 {
            return Vec::new();
        }
        (0..used)
            .map(|j| self.config.tools[(self.next_tool + j) % n].clone())
            .collect()
    }

    /// The reflector's answer: usable proposals become children (one without screening, all of them with it).
    fn take_proposals(
        &mut self,
        parent: CandidateId,
        tool: String,
        spread: Vec<String>,
        tasks: Vec<TaskId>,
        parent_scores: Scores,
        outcome: Outcome,
    ) {
        let (offered, mut refused): (Vec<Offered>, Vec<String>) = match outcome {
            Outcome::Proposed {
                description,
                diagnosis,
                ..
            } => (vec![(tool.clone(), description, diagnosis)], Vec::new()),
            Outcome::ProposedMany {
                proposals,
                tools,
                failures,
                ..
            } => {
                // `check` has made sure `tools` is empty or names an asked tool for every proposal.
                let offered = proposals
                    .into_iter()
                    .enumerate()
                    .map(|(i, (d, why))| (tools.get(i).unwrap_or(&tool).clone(), d, why))
                    .collect();
                (offered, failures)
            }
            Outcome::ProposalFailed { reason, .. } => (Vec::new(), vec![reason]),
            Outcome::Evaluated { .. } | Outcome::Screened { .. } => {
                unreachable!("`check` admits only proposals while reflecting")
            }
        };
        let mut usable: Vec<Offered> = Vec::new();
        for (for_tool, description, diagnosis) in offered {
            let current = &self.candidates[parent.0 as usize].descriptions[&for_tool];
            if description.trim().is_empty() {
                refused.push("empty".into());
            } else if description.trim() == current.trim() {
                refused.push("unchanged".into());
            } else if usable
                .iter()
                .any(|(t, d, _)| *t == for_tool && d.trim() == description.trim())
            {
                refused.push("the same as another proposal of this reflection".into());
            } else {
                usable.push((for_tool, description, diagnosis));
            }
        }
        self.spent.unusable_proposals += refused.len() as u32;
        let screening = self.config.screening.clone();
        if screening.is_none() {
            usable.truncate(1);
        }
        if usable.is_empty() {
            self.spent.failed_proposals += 1;
            self.failed.push(FailedProposal {
                iteration: self.spent.iterations,
                parent,
                tool: if spread.is_empty() {
                    tool
                } else {
                    spread.join(", ")
                },
                reason: refused.join("; "),
            });
            self.end_iteration();
            return;
        }
        self.spent.proposals += usable.len() as u32;
        let mut children = Vec::with_capacity(usable.len());
        for (for_tool, description, diagnosis) in usable {
            let mut descriptions = self.candidates[parent.0 as usize].descriptions.clone();
            descriptions.insert(for_tool.clone(), description);
            let child = self.add_candidate(
                descriptions,
                vec![parent],
                Origin::Reflection {
                    tool: for_tool,
                    diagnosis,
                },
            );
            self.candidates[child.0 as usize].minibatch = Some(MinibatchTrial {
                tasks: tasks.clone(),
                parent_scores: parent_scores.clone(),
                child_scores: None,
            });
            children.push(child);
        }
        match screening {
            None => {
                self.phase = Phase::ChildMinibatch {
                    child: children[0],
                    tasks,
                }
            }
            Some(sc) => {
                let mut screen_tasks = tasks.clone();
                let extra = if sc.on_validation {
                    &self.validation
                } else {
                    &self.screen_sample
                };
                for t in extra {
                    if !screen_tasks.contains(t) {
                        screen_tasks.push(t.clone());
                    }
                }
                self.phase = Phase::ScreenChildren {
                    parent,
                    children,
                    minibatch: tasks,
                    tasks: screen_tasks,
                    earlier: Vec::new(),
                };
            }
        }
    }

    /// The screen of a reflection's proposals: the best goes on, the others are screened out. A spread round
    /// whose best proposals for two tools both screen above the parent first has their combination screened
    /// ([`Search::combination`]), and the best of all goes on.
    fn take_screen(
        &mut self,
        parent: CandidateId,
        children: Vec<CandidateId>,
        earlier: Vec<CandidateId>,
        minibatch: Vec<TaskId>,
        tasks: Vec<TaskId>,
        mut scores: BTreeMap<CandidateId, Scores>,
    ) {
        let sc = self
            .config
            .screening
            .clone()
            .expect("a screen phase exists only with screening on");
        let parent_screen = scores.remove(&parent).unwrap_or_default();
        self.candidates[parent.0 as usize]
            .screen
            .extend(parent_screen);
        let parent_mean = mean_over(&self.candidates[parent.0 as usize].screen, &tasks);
        for &c in &children {
            self.candidates[c.0 as usize].screen = scores.remove(&c).unwrap_or_default();
        }
        if earlier.is_empty()
            && let Some(combined) = self.combination(parent, &children, &minibatch, &tasks)
        {
            self.phase = Phase::ScreenChildren {
                parent,
                children: vec![combined],
                minibatch,
                tasks,
                earlier: children,
            };
            return;
        }
        let children: Vec<CandidateId> = earlier.into_iter().chain(children).collect();
        let (best, _) = pick_best(&children, &self.screens(&children), &tasks, &minibatch);
        for &c in &children {
            let cand = &mut self.candidates[c.0 as usize];
            let mean = mean_over(&cand.screen, &tasks);
            if c != best {
                cand.status = CandidateStatus::ScreenedOut {
                    screen: mean,
                    parent: parent_mean,
                };
                self.spent.screened_out += 1;
            }
        }
        let best_screen = self.candidates[best.0 as usize].screen.clone();
        let best_mean = mean_over(&best_screen, &tasks);
        if !sc.decisive {
            if best_mean + sc.margin >= parent_mean {
                self.phase = Phase::ChildMinibatch {
                    child: best,
                    tasks: minibatch,
                };
            } else {
                self.candidates[best.0 as usize].status = CandidateStatus::ScreenedOut {
                    screen: best_mean,
                    parent: parent_mean,
                };
                self.spent.screened_out += 1;
                self.end_iteration();
            }
            return;
        }
        // Decisive: the screen is the objective, so the minibatch part of it is the child's minibatch trial and
        // GEPA's acceptance rule applies to it as it would to rollouts.
        let child_mb: Scores = minibatch
            .iter()
            .filter_map(|t| best_screen.get(t).map(|v| (t.clone(), *v)))
            .collect();
        if !self.minibatch_trial(best, child_mb) {
            return;
        }
        let c = &mut self.candidates[best.0 as usize];
        if self.validation.iter().all(|t| best_screen.contains_key(t)) {
            c.validation = self
                .validation
                .iter()
                .map(|t| (t.clone(), best_screen[t]))
                .collect();
            self.validated(best);
        } else {
            c.status = CandidateStatus::Validating;
            self.phase = Phase::FullEval {
                candidate: best,
                tasks: self.validation.clone(),
            };
        }
    }

    /// The recorded screens of `candidates`, as [`pick_best`] takes them.
    fn screens(&self, candidates: &[CandidateId]) -> BTreeMap<CandidateId, Scores> {
        candidates
            .iter()
            .map(|&c| (c, self.candidates[c.0 as usize].screen.clone()))
            .collect()
    }

    /// The combination of a spread round's best two tools: for each tool the round proposed for, its best
    /// proposal by screen (ties as in [`pick_best`]); of those that screen strictly above the parent, the two
    /// best become one candidate with both tools' new texts (a merge of two siblings, their parent the shared
    /// ancestor), with the round's minibatch trial. Measured on the contractor suite: the agent's routing moved
    /// by 2-3 tasks of 42 when one tool's text changed and by 8 when both did (each listing the topics it
    /// covers), and a round buys one rewrite, so without this a search on the demo's budget could never show the
    /// second. `None` when fewer than two tools improve, or when the screen budget left cannot pay the
    /// combination's screen and still let the round reach its decision.
    fn combination(
        &mut self,
        parent: CandidateId,
        children: &[CandidateId],
        minibatch: &[TaskId],
        tasks: &[TaskId],
    ) -> Option<CandidateId> {
        let parent_mean = mean_over(&self.candidates[parent.0 as usize].screen, tasks);
        let tool_of = |c: CandidateId| match &self.candidates[c.0 as usize].origin {
            Origin::Reflection { tool, .. } => Some(tool.clone()),
            _ => None,
        };
        let mut tools: Vec<String> = Vec::new();
        for &c in children {
            if let Some(t) = tool_of(c)
                && !tools.contains(&t)
            {
                tools.push(t);
            }
        }
        if tools.len() < 2 {
            return None;
        }
        let screens = self.screens(children);
        // (mean, tool, best child for it), the tools whose best beats the parent, best first.
        let mut gains: Vec<(f64, String, CandidateId)> = tools
            .into_iter()
            .filter_map(|t| {
                let own: Vec<CandidateId> = children
                    .iter()
                    .copied()
                    .filter(|&c| tool_of(c).as_deref() == Some(t.as_str()))
                    .collect();
                let (best, mean) = pick_best(&own, &screens, tasks, minibatch);
                (mean > parent_mean).then_some((mean, t, best))
            })
            .collect();
        // Stable: equal means keep the round's order (the round-robin's tool first).
        gains.sort_by(|x, y| y.0.total_cmp(&x.0));
        if gains.len() < 2 {
            return None;
        }
        // A gate's decision comes after the screens, from rollouts, which the search would refuse to start with
        // the screen budget spent to the last evaluation; a decisive screen decides in the screen itself.
        let decisive = self.config.screening.as_ref().is_some_and(|s| s.decisive);
        let need = tasks.len() as u64 + u64::from(!decisive);
        let left = self
            .config
            .budget
            .max_screened
            .map(|m| m.saturating_sub(self.spent.screened));
        if left.is_some_and(|l| l < need) {
            return None;
        }
        let (a, b) = (&gains[0], &gains[1]);
        let mut descriptions = self.candidates[parent.0 as usize].descriptions.clone();
        for (_, tool, child) in [a, b] {
            let text = self.candidates[child.0 as usize].descriptions[tool].clone();
            descriptions.insert(tool.clone(), text);
        }
        let trial = self.candidates[a.2.0 as usize].minibatch.clone();
        let id = self.add_candidate(
            descriptions,
            vec![a.2, b.2],
            Origin::Merge {
                ancestor: parent,
                from_a: vec![a.1.clone()],
                from_b: vec![b.1.clone()],
            },
        );
        self.candidates[id.0 as usize].minibatch = trial.map(|t| MinibatchTrial {
            child_scores: None,
            ..t
        });
        Some(id)
    }

    /// GEPA's acceptance rule on a child's minibatch scores (rollouts, or a decisive screen): strictly better than
    /// its parent's sum. Records the scores; a rejected child is marked and ends the iteration.
    fn minibatch_trial(&mut self, child: CandidateId, scores: Scores) -> bool {
        let c = &mut self.candidates[child.0 as usize];
        let trial = c
            .minibatch
            .as_mut()
            .expect("a reflection child carries its minibatch trial");
        let to_beat: f64 = trial.parent_scores.values().sum();
        let score: f64 = scores.values().sum();
        trial.child_scores = Some(scores);
        if score > to_beat {
            self.spent.accepted += 1;
            true
        } else {
            c.status = CandidateStatus::Rejected { score, to_beat };
            self.spent.rejected += 1;
            self.end_iteration();
            false
        }
    }

    /// Checks that an outcome answers the pending action, without changing anything.
    fn check(&self, outcome: &Outcome) -> Result<(), OptimizerError> {
        if let Phase::ScreenChildren {
            parent,
            children,
            tasks,
            ..
        } = &self.phase
        {
            let Outcome::Screened { scores, .. } = outcome else {
                return Err(OptimizerError::UnexpectedOutcome {
                    expected: "a screen",
                    got: outcome.kind(),
                });
            };
            for c in std::iter::once(parent).chain(children) {
                let s = scores.get(c).ok_or_else(|| OptimizerError::MissingScore {
                    candidate: *c,
                    task: tasks.first().cloned().unwrap_or_default(),
                })?;
                check_scores(*c, tasks, s)?;
            }
            if let Some(extra) = scores
                .keys()
                .find(|k| *k != parent && !children.contains(k))
            {
                return Err(OptimizerError::WrongCandidate {
                    expected: *parent,
                    got: *extra,
                });
            }
            return Ok(());
        }
        let expected = match &self.phase {
            Phase::SeedEval => Some((CandidateId(0), &self.validation)),
            Phase::ParentMinibatch { parent, tasks } => Some((*parent, tasks)),
            Phase::ChildMinibatch { child, tasks } => Some((*child, tasks)),
            Phase::FullEval { candidate, tasks }
            | Phase::MergeEval {
                candidate, tasks, ..
            } => Some((*candidate, tasks)),
            Phase::Reflect { .. } => None,
            Phase::ScreenChildren { .. } => unreachable!("handled above"),
            Phase::Idle | Phase::Stopped(_) => return Err(OptimizerError::NothingPending),
        };
        match (expected, outcome) {
            (
                Some((want, tasks)),
                Outcome::Evaluated {
                    candidate, scores, ..
                },
            ) => {
                if *candidate != want {
                    return Err(OptimizerError::WrongCandidate {
                        expected: want,
                        got: *candidate,
                    });
                }
                check_scores(want, tasks, scores)
            }
            (
                None,
                Outcome::ProposedMany {
                    proposals, tools, ..
                },
            ) => {
                let Phase::Reflect { tool, spread, .. } = &self.phase else {
                    unreachable!("only a reflection expects a proposal")
                };
                // Unspread answers name no tools; spread ones name one of the asked tools for every proposal.
                let fits = if tools.is_empty() {
                    true
                } else {
                    tools.len() == proposals.len()
                        && tools.iter().all(|t| t == tool || spread.contains(t))
                };
                if fits {
                    Ok(())
                } else {
                    Err(OptimizerError::WrongProposalTools {
                        asked: if spread.is_empty() {
                            vec![tool.clone()]
                        } else {
                            spread.clone()
                        },
                        got: tools.clone(),
                    })
                }
            }
            (None, Outcome::Proposed { .. } | Outcome::ProposalFailed { .. }) => Ok(()),
            (Some(_), other) => Err(OptimizerError::UnexpectedOutcome {
                expected: "an evaluation",
                got: other.kind(),
            }),
            (None, other) => Err(OptimizerError::UnexpectedOutcome {
                expected: "a proposal",
                got: other.kind(),
            }),
        }
    }
}

/// A proposal as offered to the search: the tool it rewrites, the description and the diagnosis.
type Offered = (String, String, Option<String>);

/// Mean of `scores` over `tasks` (a missing task counts 0, so a candidate cannot gain by lacking a score).
pub fn mean_over(scores: &Scores, tasks: &[TaskId]) -> f64 {
    if tasks.is_empty() {
        return 0.0;
    }
    tasks
        .iter()
        .map(|t| scores.get(t).copied().unwrap_or(0.0))
        .sum::<f64>()
        / tasks.len() as f64
}

/// The k-best choice among a reflection's screened proposals: the highest mean screen score over `tasks`; a tie
/// goes to the higher sum on the minibatch (what GEPA's acceptance is decided on), then to the earlier proposal.
/// Returns the chosen candidate and its mean. `candidates` must not be empty.
pub fn pick_best(
    candidates: &[CandidateId],
    scores: &BTreeMap<CandidateId, Scores>,
    tasks: &[TaskId],
    minibatch: &[TaskId],
) -> (CandidateId, f64) {
    let empty = Scores::new();
    let key = |c: &CandidateId| {
        let s = scores.get(c).unwrap_or(&empty);
        (mean_over(s, tasks), mean_over(s, minibatch))
    };
    let mut best = candidates[0];
    let mut best_key = key(&best);
    for c in &candidates[1..] {
        let k = key(c);
        if k.0 > best_key.0 || (k.0 == best_key.0 && k.1 > best_key.1) {
            best = *c;
            best_key = k;
        }
    }
    (best, best_key.0)
}

/// Checks that `scores` holds exactly `tasks`, each in [0, 1].
fn check_scores(
    want: CandidateId,
    tasks: &[TaskId],
    scores: &Scores,
) -> Result<(), OptimizerError> {
    for t in tasks {
        match scores.get(t) {
            None => {
                return Err(OptimizerError::MissingScore {
                    candidate: want,
                    task: t.clone(),
                });
            }
            Some(&s) if !(0.0..=1.0).contains(&s) => {
                return Err(OptimizerError::InvalidScore {
                    candidate: want,
                    task: t.clone(),
                    score: s,
                });
            }
            Some(_) => {}
        }
    }
    if let Some(extra) = scores.keys().find(|k| !tasks.contains(k)) {
        return Err(OptimizerError::UnexpectedTask {
            candidate: want,
            task: extra.clone(),
        });
    }
    Ok(())
}

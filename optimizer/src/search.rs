//! The search state machine: [`Search::next`] says what to do, [`Search::observe`] takes the result. See the crate
//! documentation for the protocol.

use crate::candidate::{
    Candidate, CandidateStatus, FailedProposal, MinibatchTrial, Origin, Progress,
};
use crate::config::Config;
use crate::merge::merge_options;
use crate::protocol::{Action, Observation, Outcome, Spent, StopReason};
use crate::{CandidateId, Descriptions, Frontier, OptimizerError, Scores, TaskId};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Where the search is within an iteration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "phase")]
enum Phase {
    /// The seed awaits its validation.
    SeedEval,
    /// Between iterations.
    Idle,
    ParentMinibatch {
        parent: CandidateId,
        tasks: Vec<TaskId>,
    },
    Reflect {
        parent: CandidateId,
        tool: String,
        tasks: Vec<TaskId>,
        parent_scores: Scores,
    },
    ScreenChildren {
        parent: CandidateId,
        children: Vec<CandidateId>,
        minibatch: Vec<TaskId>,
        tasks: Vec<TaskId>,
    },
    ChildMinibatch {
        child: CandidateId,
        tasks: Vec<TaskId>,
    },
    FullEval {
        candidate: CandidateId,
        tasks: Vec<TaskId>,
    },
    MergeEval {
        candidate: CandidateId,
        a: CandidateId,
        b: CandidateId,
        ancestor: CandidateId,
        tasks: Vec<TaskId>,
    },
    Stopped(StopReason),
}

/// The GEPA search. Serialise it to persist a run; deserialise to resume.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Search {
    config: Config,
    train: Vec<TaskId>,
    validation: Vec<TaskId>,
    candidates: Vec<Candidate>,
    failed: Vec<FailedProposal>,
    spent: Spent,
    phase: Phase,
    /// Whether the action of `phase` has been handed out (and awaits its observation).
    issued: bool,
    stop_requested: bool,
    /// Index into `config.tools` of the next tool to mutate.
    next_tool: usize,
    /// The current epoch's shuffled training order and the position in it.
    train_order: Vec<TaskId>,
    train_pos: usize,
    /// GEPA's merge schedule: one merge falls due per accepted reflection, tried right after it.
    merges_due: u32,
    last_found_new: bool,
    tried_merges: BTreeSet<(CandidateId, CandidateId, CandidateId)>,
    improved_this_iteration: bool,
    rng: ChaCha8Rng,
    /// The training tasks screened beside each minibatch ([`crate::Screening::sample`]); fixed at the start.
    #[serde(default)]
    screen_sample: Vec<TaskId>,
}

impl Search {
    /// Starts a search from the server's current descriptions (`seed_descriptions`, every tool of the server;
    /// `config.tools` names those under study), the training tasks minibatches are drawn from and the validation
    /// tasks candidates are compared on (they may overlap; a held-out test split stays with the driver).
    pub fn new(
        config: Config,
        seed_descriptions: Descriptions,
        train: Vec<TaskId>,
        validation: Vec<TaskId>,
        seed: u64,
    ) -> Result<Search, OptimizerError> {
        config.validate()?;
        for t in &config.tools {
            if !seed_descriptions.contains_key(t) {
                return Err(OptimizerError::UnknownTool { tool: t.clone() });
            }
        }
        check_split("train", &train)?;
        check_split("validation", &validation)?;
        // Drawn with a generator of its own, so the search's own draws (minibatches, merges) are the same with or
        // without a sample.
        let screen_sample = match &config.screening {
            Some(sc) if !sc.on_validation && sc.sample > 0 => {
                let mut order = train.clone();
                order.shuffle(&mut ChaCha8Rng::seed_from_u64(seed ^ 0x5c4e_e2a3_0f1d_7b19));
                order.truncate(sc.sample);
                order
            }
            _ => Vec::new(),
        };
        let seed_candidate = Candidate {
            id: CandidateId(0),
            descriptions: seed_descriptions,
            parents: Vec::new(),
            origin: Origin::Seed,
            status: CandidateStatus::Trial,
            validation: Scores::new(),
            validation_mean: None,
            minibatch: None,
            found_at: None,
            screen: Scores::new(),
        };
        Ok(Search {
            config,
            train,
            validation,
            candidates: vec![seed_candidate],
            failed: Vec::new(),
            spent: Spent::default(),
            phase: Phase::SeedEval,
            issued: false,
            stop_requested: false,
            next_tool: 0,
            train_order: Vec::new(),
            train_pos: 0,
            merges_due: 0,
            last_found_new: false,
            tried_merges: BTreeSet::new(),
            improved_this_iteration: false,
            rng: ChaCha8Rng::seed_from_u64(seed),
            screen_sample,
        })
    }

    /// The next action. Until it is answered by [`Search::observe`], calling this again returns the same action.
    #[allow(clippy::should_implement_trait)] // Not an iterator: it never ends with `None` and needs `observe`.
    pub fn next(&mut self) -> Action {
        if !self.issued {
            self.advance();
            self.issued = true;
        }
        self.action()
    }

    /// Feeds back the result of the pending action. On error nothing changes.
    pub fn observe(&mut self, obs: Observation) -> Result<(), OptimizerError> {
        if !self.issued || matches!(self.phase, Phase::Stopped(_) | Phase::Idle) {
            return Err(OptimizerError::NothingPending);
        }
        self.check(&obs.outcome)?;
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
            } => self.spent.reflection_tokens += reflection_tokens,
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
                    let tool = self.config.tools[self.next_tool % self.config.tools.len()].clone();
                    self.next_tool = (self.next_tool + 1) % self.config.tools.len();
                    self.spent.reflections += 1;
                    self.phase = Phase::Reflect {
                        parent,
                        tool,
                        tasks,
                        parent_scores: scores,
                    };
                }
            }
            (
                Phase::Reflect {
                    parent,
                    tool,
                    tasks,
                    parent_scores,
                },
                outcome,
            ) => self.take_proposals(parent, tool, tasks, parent_scores, outcome),
            (
                Phase::ScreenChildren {
                    parent,
                    children,
                    minibatch,
                    tasks,
                },
                Outcome::Screened { scores, .. },
            ) => self.take_screen(parent, children, minibatch, tasks, scores),
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
        if matches!(
            self.candidates[candidate.0 as usize].origin,
            Origin::Reflection { .. }
        ) {
            self.last_found_new = true;
            if self.spent.merges_tried + self.merges_due < self.config.max_merges {
                self.merges_due += 1;
            }
        }
        self.end_iteration();
    }

    /// The reflector's answer: usable proposals become children (one without screening, all of them with it).
    fn take_proposals(
        &mut self,
        parent: CandidateId,
        tool: String,
        tasks: Vec<TaskId>,
        parent_scores: Scores,
        outcome: Outcome,
    ) {
        let current = self.candidates[parent.0 as usize].descriptions[&tool].clone();
        let (offered, mut refused): (Vec<(String, Option<String>)>, Vec<String>) = match outcome {
            Outcome::Proposed {
                description,
                diagnosis,
                ..
            } => (vec![(description, diagnosis)], Vec::new()),
            Outcome::ProposedMany {
                proposals,
                failures,
                ..
            } => (proposals, failures),
            Outcome::ProposalFailed { reason, .. } => (Vec::new(), vec![reason]),
            Outcome::Evaluated { .. } | Outcome::Screened { .. } => {
                unreachable!("`check` admits only proposals while reflecting")
            }
        };
        let mut usable: Vec<(String, Option<String>)> = Vec::new();
        for (description, diagnosis) in offered {
            if description.trim().is_empty() {
                refused.push("empty".into());
            } else if description.trim() == current.trim() {
                refused.push("unchanged".into());
            } else if usable.iter().any(|(d, _)| d.trim() == description.trim()) {
                refused.push("the same as another proposal of this reflection".into());
            } else {
                usable.push((description, diagnosis));
            }
        }
        let screening = self.config.screening.clone();
        if screening.is_none() {
            usable.truncate(1);
        }
        if usable.is_empty() {
            self.spent.failed_proposals += 1;
            self.failed.push(FailedProposal {
                iteration: self.spent.iterations,
                parent,
                tool,
                reason: refused.join("; "),
            });
            self.end_iteration();
            return;
        }
        self.spent.proposals += usable.len() as u32;
        let mut children = Vec::with_capacity(usable.len());
        for (description, diagnosis) in usable {
            let mut descriptions = self.candidates[parent.0 as usize].descriptions.clone();
            descriptions.insert(tool.clone(), description);
            let child = self.add_candidate(
                descriptions,
                vec![parent],
                Origin::Reflection {
                    tool: tool.clone(),
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
                };
            }
        }
    }

    /// The screen of a reflection's proposals: the best goes on, the others are screened out.
    fn take_screen(
        &mut self,
        parent: CandidateId,
        children: Vec<CandidateId>,
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
        let parent_mean = mean_over(&parent_screen, &tasks);
        self.candidates[parent.0 as usize]
            .screen
            .extend(parent_screen);
        let (best, _) = pick_best(&children, &scores, &tasks, &minibatch);
        for &c in &children {
            let s = scores.remove(&c).unwrap_or_default();
            let cand = &mut self.candidates[c.0 as usize];
            let mean = mean_over(&s, &tasks);
            cand.screen = s;
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

    /// Asks the search to stop before its next new action (the pending one, if any, is still expected).
    pub fn request_stop(&mut self) {
        self.stop_requested = true;
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The training tasks minibatches are drawn from.
    pub fn train_tasks(&self) -> &[TaskId] {
        &self.train
    }

    /// The validation tasks candidates are compared on.
    pub fn validation_tasks(&self) -> &[TaskId] {
        &self.validation
    }

    /// The training tasks screened beside every minibatch ([`crate::Screening::sample`]), fixed at the start;
    /// empty when proposals are screened on the validation split or the minibatch alone. The driver also shows
    /// them to the reflector: their parent screens are made (and cached) for the gate anyway.
    pub fn screen_sample(&self) -> &[TaskId] {
        &self.screen_sample
    }

    /// Every candidate made, in order of creation (index = id).
    pub fn candidates(&self) -> &[Candidate] {
        &self.candidates
    }

    /// One candidate.
    pub fn candidate(&self, id: CandidateId) -> Option<&Candidate> {
        self.candidates.get(id.0 as usize)
    }

    /// Reflections that gave no new description.
    pub fn failed_proposals(&self) -> &[FailedProposal] {
        &self.failed
    }

    /// What has been spent and done.
    pub fn spent(&self) -> &Spent {
        &self.spent
    }

    /// Why the search stopped, once it has.
    pub fn stopped(&self) -> Option<StopReason> {
        match self.phase {
            Phase::Stopped(r) => Some(r),
            _ => None,
        }
    }

    /// The pooled candidate with the highest mean validation score (ties: the earlier); `None` before the seed is
    /// validated.
    pub fn best(&self) -> Option<&Candidate> {
        let mut best: Option<&Candidate> = None;
        for c in self.pool() {
            if best.is_none_or(|b| c.validation_mean > b.validation_mean) {
                best = Some(c);
            }
        }
        best
    }

    /// The Pareto frontier of the pool over validation scores.
    pub fn frontier(&self) -> Frontier {
        Frontier::of(self.pool().map(|c| (c.id, &c.validation)))
    }

    fn pool(&self) -> impl Iterator<Item = &Candidate> {
        self.candidates
            .iter()
            .filter(|c| c.status == CandidateStatus::InPool)
    }

    fn progress(&self) -> Progress {
        Progress {
            rollouts: self.spent.rollouts,
            reflection_tokens: self.spent.reflection_tokens,
            elapsed_ms: self.spent.elapsed_ms,
            iteration: self.spent.iterations,
            screened: self.spent.screened,
        }
    }

    fn add_candidate(
        &mut self,
        descriptions: Descriptions,
        parents: Vec<CandidateId>,
        origin: Origin,
    ) -> CandidateId {
        let id = CandidateId(self.candidates.len() as u32);
        self.candidates.push(Candidate {
            id,
            descriptions,
            parents,
            origin,
            status: CandidateStatus::Trial,
            validation: Scores::new(),
            validation_mean: None,
            minibatch: None,
            found_at: None,
            screen: Scores::new(),
        });
        id
    }

    fn enter_pool(&mut self, id: CandidateId) {
        let before = self.best().and_then(|b| b.validation_mean);
        let progress = self.progress();
        let c = &mut self.candidates[id.0 as usize];
        let n = self.validation.len() as f64;
        let mean = self.validation.iter().map(|t| c.validation[t]).sum::<f64>() / n;
        c.validation_mean = Some(mean);
        c.status = CandidateStatus::InPool;
        c.found_at = Some(progress);
        if before.is_none_or(|b| mean > b) {
            self.improved_this_iteration = true;
        }
    }

    fn end_iteration(&mut self) {
        self.spent.iterations += 1;
        if self.improved_this_iteration {
            self.spent.since_improvement = 0;
        } else {
            self.spent.since_improvement += 1;
        }
        self.improved_this_iteration = false;
        self.phase = Phase::Idle;
    }

    /// The limits checked before every new action.
    fn hard_stop(&self) -> Option<StopReason> {
        let b = &self.config.budget;
        if self.stop_requested {
            Some(StopReason::StopRequested)
        } else if b.max_wall_ms.is_some_and(|m| self.spent.elapsed_ms >= m) {
            Some(StopReason::WallTime)
        } else if b.max_rollouts.is_some_and(|m| self.spent.rollouts >= m) {
            Some(StopReason::RolloutBudget)
        } else if b
            .max_reflection_tokens
            .is_some_and(|m| self.spent.reflection_tokens >= m)
        {
            Some(StopReason::TokenBudget)
        } else if b.max_screened.is_some_and(|m| self.spent.screened >= m) {
            Some(StopReason::ScreenBudget)
        } else {
            None
        }
    }

    /// The conditions checked between iterations.
    fn soft_stop(&self) -> Option<StopReason> {
        let c = &self.config;
        if let (Some(t), Some(best)) = (
            c.score_threshold,
            self.best().and_then(|b| b.validation_mean),
        ) && best >= t
        {
            return Some(StopReason::ScoreThreshold);
        }
        if c.patience
            .is_some_and(|p| self.spent.since_improvement >= p)
        {
            return Some(StopReason::Patience);
        }
        if c.max_iterations.is_some_and(|m| self.spent.iterations >= m) {
            return Some(StopReason::MaxIterations);
        }
        None
    }

    /// Moves to the phase of the next action to hand out: checks the limits and, between iterations, starts one.
    fn advance(&mut self) {
        if matches!(self.phase, Phase::Stopped(_)) {
            return;
        }
        let idle = self.phase == Phase::Idle;
        let stop = self
            .hard_stop()
            .or_else(|| if idle { self.soft_stop() } else { None });
        if let Some(reason) = stop {
            for c in &mut self.candidates {
                if matches!(
                    c.status,
                    CandidateStatus::Trial | CandidateStatus::Validating
                ) {
                    c.status = CandidateStatus::Abandoned;
                }
            }
            self.phase = Phase::Stopped(reason);
            return;
        }
        if !idle {
            return;
        }
        if self.merges_due > 0 && self.last_found_new && self.try_merge() {
            return;
        }
        self.last_found_new = false;
        let frontier = self.frontier();
        let parent = frontier
            .sample(&mut self.rng)
            .expect("the validated seed keeps the frontier non-empty");
        let tasks = self.next_minibatch();
        self.phase = Phase::ParentMinibatch { parent, tasks };
    }

    /// Starts a merge if one is available; GEPA draws among the candidates uniformly.
    fn try_merge(&mut self) -> bool {
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

    /// The next minibatch: consecutive tasks of a shuffled training order, reshuffled at each epoch's end, with no
    /// task twice in one batch. A training split no larger than the batch is used whole.
    fn next_minibatch(&mut self) -> Vec<TaskId> {
        let size = self.config.minibatch_size;
        if self.train.len() <= size {
            return self.train.clone();
        }
        let mut batch: Vec<TaskId> = Vec::with_capacity(size);
        while batch.len() < size {
            if self.train_pos >= self.train_order.len() {
                self.train_order = self.train.clone();
                self.train_order.shuffle(&mut self.rng);
                self.train_pos = 0;
            }
            let t = &self.train_order[self.train_pos];
            self.train_pos += 1;
            if !batch.contains(t) {
                batch.push(t.clone());
            }
        }
        batch
    }

    /// The action of the current phase.
    fn action(&self) -> Action {
        let desc = |id: CandidateId| self.candidates[id.0 as usize].descriptions.clone();
        match &self.phase {
            Phase::SeedEval => Action::EvaluateFull {
                candidate: CandidateId(0),
                descriptions: desc(CandidateId(0)),
                tasks: self.validation.clone(),
            },
            Phase::ParentMinibatch { parent, tasks } => Action::EvaluateMinibatch {
                candidate: *parent,
                descriptions: desc(*parent),
                tasks: tasks.clone(),
            },
            Phase::Reflect {
                parent,
                tool,
                tasks,
                ..
            } => Action::Reflect {
                parent: *parent,
                tool: tool.clone(),
                current: self.candidates[parent.0 as usize].descriptions[tool].clone(),
                tasks: tasks.clone(),
                proposals: self.config.screening.as_ref().map_or(1, |s| s.proposals),
            },
            Phase::ScreenChildren {
                parent,
                children,
                tasks,
                ..
            } => Action::Screen {
                parent: *parent,
                candidates: std::iter::once(parent)
                    .chain(children)
                    .map(|c| (*c, desc(*c)))
                    .collect(),
                tasks: tasks.clone(),
            },
            Phase::ChildMinibatch { child, tasks } => Action::EvaluateMinibatch {
                candidate: *child,
                descriptions: desc(*child),
                tasks: tasks.clone(),
            },
            Phase::FullEval { candidate, tasks } => Action::EvaluateFull {
                candidate: *candidate,
                descriptions: desc(*candidate),
                tasks: tasks.clone(),
            },
            Phase::MergeEval {
                candidate,
                a,
                b,
                ancestor,
                tasks,
            } => Action::Merge {
                candidate: *candidate,
                a: *a,
                b: *b,
                ancestor: *ancestor,
                descriptions: desc(*candidate),
                tasks: tasks.clone(),
            },
            Phase::Stopped(r) => Action::Stop(*r),
            // `next` always leaves a phase with an action; an idle search has just been advanced out of it.
            Phase::Idle => unreachable!("an idle search is advanced before its action is read"),
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
                Outcome::Proposed { .. }
                | Outcome::ProposalFailed { .. }
                | Outcome::ProposedMany { .. },
            ) => Ok(()),
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

fn check_split(split: &'static str, tasks: &[TaskId]) -> Result<(), OptimizerError> {
    if tasks.is_empty() {
        return Err(OptimizerError::InvalidTasks {
            split,
            reason: "is empty".into(),
        });
    }
    let mut seen = BTreeSet::new();
    for t in tasks {
        if !seen.insert(t) {
            return Err(OptimizerError::InvalidTasks {
                split,
                reason: format!("lists task {t:?} twice"),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Budget;

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
        Search::new(c, seed_descriptions(tools), tasks("t", 6), tasks("v", 4), 7)
            .expect("valid search")
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
}

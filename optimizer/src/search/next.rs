//! What to do next: [`Search::next`], the limits checked before each action, the start of an iteration (parent
//! and minibatch) and the action of each phase.

use super::{Phase, Search};
use crate::candidate::CandidateStatus;
use crate::protocol::{Action, StopReason};
use crate::{CandidateId, TaskId};
use rand::seq::SliceRandom;

impl Search {
    /// The next action. Until it is answered by [`Search::observe`], calling this again returns the same action.
    #[allow(clippy::should_implement_trait)] // Not an iterator: it never ends with `None` and needs `observe`.
    pub fn next(&mut self) -> Action {
        if !self.issued {
            self.advance();
            self.issued = true;
        }
        self.action()
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

    /// Between iterations: the budget left cannot carry a new iteration to its acceptance decision, so none is
    /// started. Without this check a search with a few rollouts left began an iteration whose parent minibatch
    /// was played and then thrown away when the budget stopped it before the child's (measured in the demo: the
    /// last 3 of 25 rollouts, 11 s); with screens, a whole reflection was paid for and its children screened past
    /// the budget. What an iteration needs at least (the gate counted at its largest, its minibatch and sample
    /// disjoint): the parent's and one child's minibatch (rollouts, or
    /// screens when the screen is decisive) and, with a gate, one child's gate screen. An accepted child's
    /// validation is not counted in: a search that could reach a decision but not validate the child still
    /// stops there, as before, because refusing the iteration would also refuse the rejected children's
    /// iterations that fit. Rollouts served from the driver's cache cost less than this counts, so a search on
    /// cached rollouts may stop slightly early; it never starts what it cannot decide.
    fn unaffordable(&self) -> Option<StopReason> {
        let b = &self.config.budget;
        let m = self.config.minibatch_size.min(self.train.len()) as u64;
        let short = |max: Option<u64>, spent: u64, need: u64| {
            max.is_some_and(|max| max.saturating_sub(spent) < need)
        };
        let sc = self.config.screening.as_ref();
        // One child's gate screen: its minibatch and the validation split or the fixed training sample.
        let gate = sc.map(|sc| {
            m + if sc.on_validation {
                self.validation.len()
            } else {
                self.screen_sample.len()
            } as u64
        });
        let decisive = sc.is_some_and(|sc| sc.decisive);
        if decisive {
            // Every evaluation is a screen: the parent's minibatch, then one child's gate.
            let need = m + gate.unwrap_or(0);
            return short(b.max_screened, self.spent.screened, need)
                .then_some(StopReason::ScreenBudget);
        }
        if short(b.max_rollouts, self.spent.rollouts, 2 * m) {
            return Some(StopReason::RolloutBudget);
        }
        // One more than the gate: a gate that spent the screen budget to its last evaluation would have the
        // child's minibatch refused by the hard limit, the round thrown away undecided.
        gate.filter(|&g| short(b.max_screened, self.spent.screened, g + 1))
            .map(|_| StopReason::ScreenBudget)
    }

    /// Moves to the phase of the next action to hand out: checks the limits and, between iterations, starts one.
    fn advance(&mut self) {
        if matches!(self.phase, Phase::Stopped(_)) {
            return;
        }
        let idle = self.phase == Phase::Idle;
        let stop = self.hard_stop().or_else(|| {
            if idle {
                self.soft_stop().or_else(|| self.unaffordable())
            } else {
                None
            }
        });
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

    /// The next minibatch: consecutive tasks of a shuffled training order, reshuffled at each epoch's end, with no
    /// task twice in one batch. A training split no larger than the batch is used whole.
    pub(super) fn next_minibatch(&mut self) -> Vec<TaskId> {
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
                spread,
                ..
            } => Action::Reflect {
                parent: *parent,
                tool: tool.clone(),
                current: self.candidates[parent.0 as usize].descriptions[tool].clone(),
                tasks: tasks.clone(),
                proposals: self.config.screening.as_ref().map_or(1, |s| s.proposals),
                spread: spread.clone(),
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
}

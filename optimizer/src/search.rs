//! The search state machine: [`Search::next`] says what to do, [`Search::observe`] takes the result. See the crate
//! documentation for the protocol.
//!
//! The `impl Search` is spread over submodules by job: this file holds the state (the phases, the serialised
//! struct), construction, the accessors and the pool bookkeeping; `next` says what to do, `observe` takes in the
//! results (evaluations, proposals, screens), `merge` starts merges.

mod merge;
mod next;
mod observe;
#[cfg(test)]
mod tests;

pub use observe::{mean_over, pick_best};

use crate::candidate::{Candidate, CandidateStatus, FailedProposal, Origin, Progress};
use crate::config::Config;
use crate::protocol::{Spent, StopReason};
use crate::{CandidateId, Descriptions, Frontier, OptimizerError, Scores, TaskId};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

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
        /// The tools the proposals are spread over, `tool` first ([`crate::Screening::spread`]); empty: all
        /// proposals rewrite `tool` (and a checkpoint from before spreading reads so).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        spread: Vec<String>,
    },
    ScreenChildren {
        parent: CandidateId,
        children: Vec<CandidateId>,
        minibatch: Vec<TaskId>,
        tasks: Vec<TaskId>,
        /// The round's proposals already screened, when `children` is the combination of the best two tools'
        /// proposals ([`Search::combination`]); empty on the first screen of a round (and in checkpoints from
        /// before combinations).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        earlier: Vec<CandidateId>,
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

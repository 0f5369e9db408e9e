//! What a rollout job is: everything a worker on another machine needs to play one task with one candidate, and
//! nothing it could not check. Pure: no IO.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use tooltune_evaluator::evaluate::Mode;

/// One task to play (a full rollout) or to screen (exact first moves) with one candidate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    /// The result's content address (the driver's rollout or screen key): a job that runs twice stores one
    /// result under it.
    pub key: String,
    /// The suite's content address (sha256 of its file), kept in the store's `job_suites`.
    pub suite: String,
    /// The agent model's identity (see [`agent_identity`]): only a worker with the same identity takes the job.
    pub model: String,
    /// The task's id in the suite.
    pub task_id: String,
    /// A full rollout or only the first move.
    pub mode: Mode,
    /// The candidate's descriptions, by tool name (tools it does not name keep the server's own).
    pub descriptions: BTreeMap<String, String>,
    /// The tool whose selection is measured.
    pub target: String,
    /// The rollout's index (several per task with a sampling host).
    pub rollout: u32,
    /// The host's sampling seed.
    pub seed: Option<u64>,
    /// Run id written into the stored trajectory.
    pub run_id: Option<String>,
    /// Candidate id written into the stored trajectory.
    pub candidate_id: Option<String>,
    /// How many times the job may be taken before it is given up as an infrastructure failure.
    pub max_attempts: u32,
    /// Timeout of one tool call, in milliseconds.
    pub call_timeout_ms: u64,
}

impl Job {
    /// What jobs must share to run as one batch of the model: everything but the task and the key.
    pub fn batch_key(&self) -> String {
        let mut h = Sha256::new();
        let parts = serde_json::json!([
            self.suite,
            self.model,
            self.mode,
            self.descriptions,
            self.target,
            self.rollout,
            self.seed,
            self.run_id,
            self.candidate_id,
            self.call_timeout_ms,
        ]);
        h.update(parts.to_string().as_bytes());
        hex::encode(h.finalize())
    }
}

/// The identity a worker must share with the driver for its results to be the ones the driver would have got:
/// the model's own id (the embedded model's name, or an endpoint and model name), the settings that change its
/// greedy output (`ChatModel::numerics`: a thread count), the SIMD path greedy output depends on, and the host's
/// version.
pub fn agent_identity(model_id: &str, numerics: &str) -> String {
    let numerics = if numerics.is_empty() {
        String::new()
    } else {
        format!(", {numerics}")
    };
    format!(
        "{model_id}{numerics} on {} ({})",
        tooltune_evaluator::host::simd_path(),
        tooltune_evaluator::host::HOST_VERSION
    )
}

/// The pgmq queue of a model and a suite: `tt_` and 24 hex digits of their hash (pgmq allows letters, digits and
/// `_`, 47 characters at most).
pub fn queue_name(model: &str, suite_digest: &str) -> String {
    let mut h = Sha256::new();
    for part in [model, suite_digest] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    format!("tt_{}", &hex::encode(h.finalize())[..24])
}

/// Where a job stands when a worker reads it: `attempt` is pgmq's read count (1 on the first read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Play it.
    Run,
    /// It was taken `max_attempts` times without a result (its workers were killed or cut off each time): give it
    /// up as an infrastructure failure without running it again, so one poison job cannot occupy the workers.
    GiveUp,
}

/// Whether the `attempt`-th read of `job` should run it.
pub fn verdict(job: &Job, attempt: i32) -> Verdict {
    if attempt > i32::try_from(job.max_attempts.max(1)).unwrap_or(i32::MAX) {
        Verdict::GiveUp
    } else {
        Verdict::Run
    }
}

/// Groups jobs into model batches of at most `batch`, in the order they came: jobs that share a
/// [`Job::batch_key`] run together. Returns indices into `jobs`.
pub fn batches(jobs: &[Job], batch: usize) -> Vec<Vec<usize>> {
    let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
    for (i, j) in jobs.iter().enumerate() {
        let k = j.batch_key();
        match groups
            .iter_mut()
            .find(|(g, members)| *g == k && members.len() < batch.max(1))
        {
            Some((_, members)) => members.push(i),
            None => groups.push((k, vec![i])),
        }
    }
    groups.into_iter().map(|(_, m)| m).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn job(task: &str, candidate: &str) -> Job {
        Job {
            key: format!("rollout-{task}-{candidate}"),
            suite: "s".into(),
            model: "m".into(),
            task_id: task.into(),
            mode: Mode::Full,
            descriptions: [("search_docs".to_string(), candidate.to_string())].into(),
            target: "search_docs".into(),
            rollout: 0,
            seed: Some(0),
            run_id: Some("run-1".into()),
            candidate_id: Some(candidate.into()),
            max_attempts: 3,
            call_timeout_ms: 30_000,
        }
    }

    #[test]
    fn jobs_of_one_candidate_batch_together_and_others_apart() {
        let jobs = vec![job("a", "x"), job("b", "y"), job("c", "x"), job("d", "x")];
        assert_eq!(batches(&jobs, 8), vec![vec![0, 2, 3], vec![1]]);
        assert_eq!(batches(&jobs, 2), vec![vec![0, 2], vec![1], vec![3]]);
        let mut screen = job("e", "x");
        screen.mode = Mode::SelectionOnly;
        assert_ne!(screen.batch_key(), job("e", "x").batch_key());
        assert_eq!(job("e", "x").batch_key(), job("f", "x").batch_key());
    }

    #[test]
    fn a_job_is_given_up_after_its_last_attempt() {
        let j = job("a", "x");
        assert_eq!(verdict(&j, 1), Verdict::Run);
        assert_eq!(verdict(&j, 3), Verdict::Run);
        assert_eq!(verdict(&j, 4), Verdict::GiveUp);
        let once = Job {
            max_attempts: 0,
            ..job("a", "x")
        };
        assert_eq!(verdict(&once, 1), Verdict::Run);
        assert_eq!(verdict(&once, 2), Verdict::GiveUp);
    }

    #[test]
    fn a_job_survives_its_json_unchanged() {
        let j = job("a", "x");
        let text = serde_json::to_string(&j).expect("a job serialises");
        let back: Job = serde_json::from_str(&text).expect("and reads back");
        assert_eq!(back, j);
    }

    proptest! {
        #[test]
        fn queue_names_are_valid_pgmq_names_and_tell_models_and_suites_apart(
            model in ".{0,40}", suite in "[0-9a-f]{0,64}", other in ".{0,40}"
        ) {
            let q = queue_name(&model, &suite);
            prop_assert!(q.len() <= 47);
            prop_assert!(q.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
            if other != model {
                prop_assert_ne!(q.clone(), queue_name(&other, &suite));
            }
            prop_assert_eq!(q, queue_name(&model, &suite));
        }

        #[test]
        fn batching_keeps_every_job_once_in_order_and_within_the_size(
            candidates in proptest::collection::vec(0u8..3, 0..30), size in 1usize..10
        ) {
            let jobs: Vec<Job> = candidates
                .iter()
                .enumerate()
                .map(|(i, c)| job(&i.to_string(), &c.to_string()))
                .collect();
            let groups = batches(&jobs, size);
            let mut seen: Vec<usize> = groups.iter().flatten().copied().collect();
            for g in &groups {
                prop_assert!(!g.is_empty() && g.len() <= size);
                prop_assert!(g.windows(2).all(|w| w[0] < w[1]));
                prop_assert!(g.iter().all(|&i| jobs[i].batch_key() == jobs[g[0]].batch_key()));
            }
            seen.sort_unstable();
            prop_assert_eq!(seen, (0..jobs.len()).collect::<Vec<_>>());
        }
    }
}

//! Runs of the optimizer: their configuration, checkpointed search state, per-task rollout results, reflections
//! and progress events. Bodies are JSON text: the store keeps them and finds them by key, without knowing their
//! shape, so that it stays independent of the optimizer's types.

use crate::{Store, StoreError, q};
use serde::Serialize;
use sqlx::Row;
use tooltune_objectives::Objective;

/// Where a run stands, as its row stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    /// Being driven, or stopped by a crash without a word (its lease then runs out and it can be resumed).
    Running,
    /// Ended with its summary.
    Finished,
    /// Ended by an error (`RunRow::error` says which).
    Failed,
    /// Stopped on request (stop file, Ctrl-C, the API); it can be resumed.
    Stopped,
}

impl RunStatus {
    /// The word the store and the API use.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Finished => "finished",
            RunStatus::Failed => "failed",
            RunStatus::Stopped => "stopped",
        }
    }

    /// Reads the stored word.
    pub fn parse(word: &str) -> Option<RunStatus> {
        Some(match word {
            "running" => RunStatus::Running,
            "finished" => RunStatus::Finished,
            "failed" => RunStatus::Failed,
            "stopped" => RunStatus::Stopped,
            _ => return None,
        })
    }

    /// Whether the run has ended (for now: a stopped run can be resumed).
    pub fn is_terminal(self) -> bool {
        self != RunStatus::Running
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What made a run, as its row stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum RunKind {
    /// A GEPA search (`optimize`, `demo`, the API): resumable, has a checkpoint, events and a report.
    #[serde(rename = "optimize")]
    Optimize,
    /// A batch proposal from logged failures (`optimize --from-traces`): one short command, no search.
    #[serde(rename = "from-traces")]
    FromTraces,
}

impl RunKind {
    /// The word the store and the API use.
    pub fn as_str(self) -> &'static str {
        match self {
            RunKind::Optimize => "optimize",
            RunKind::FromTraces => "from-traces",
        }
    }

    /// Reads the stored word.
    pub fn parse(word: &str) -> Option<RunKind> {
        Some(match word {
            "optimize" => RunKind::Optimize,
            "from-traces" => RunKind::FromTraces,
            _ => return None,
        })
    }
}

impl std::fmt::Display for RunKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A stored run.
#[derive(Debug, Clone, Serialize)]
pub struct RunRow {
    /// The run id.
    pub id: String,
    /// What made it.
    pub kind: RunKind,
    /// The suite file, when there is one.
    pub suite: Option<String>,
    /// What the run optimises.
    pub objective: Objective,
    /// JSON configuration.
    pub config: String,
    /// Where it stands.
    pub status: RunStatus,
    /// JSON checkpoint of the search.
    pub state: Option<String>,
    /// Wall time spent so far, over all sessions of the run.
    pub elapsed_ms: i64,
    /// JSON summary once finished.
    pub result: Option<String>,
    /// Why it failed.
    pub error: Option<String>,
    /// Creation time (RFC 3339).
    pub created_at: String,
    /// Last update (RFC 3339).
    pub updated_at: String,
}

/// One stored rollout result.
#[derive(Debug, Clone)]
pub struct RolloutRow {
    /// Task id.
    pub task_id: String,
    /// Rollout index.
    pub rollout: i64,
    /// JSON per-task result.
    pub result: String,
    /// Linked trajectory.
    pub trajectory_id: Option<String>,
}

pub(crate) fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

const RUN_COLS: &str = "id, kind, suite, objective, config, status, state, elapsed_ms, result, error, created_at, updated_at";

fn run_row(r: &sqlx::any::AnyRow) -> Result<RunRow, StoreError> {
    let id: String = r.get(0);
    let corrupt = |message: String| StoreError::CorruptRun {
        id: id.clone(),
        message,
    };
    let objective: String = r.get(3);
    let objective = objective
        .parse::<Objective>()
        .map_err(|e| corrupt(format!("column `objective`: {e}")))?;
    let kind: String = r.get(1);
    let kind = RunKind::parse(&kind).ok_or_else(|| {
        corrupt(format!(
            "column `kind` is {kind:?}, not optimize or from-traces"
        ))
    })?;
    let status: String = r.get(5);
    let status = RunStatus::parse(&status).ok_or_else(|| {
        corrupt(format!(
            "column `status` is {status:?}, not running, finished, failed or stopped"
        ))
    })?;
    Ok(RunRow {
        id: r.get(0),
        kind,
        suite: r.get(2),
        objective,
        config: r.get(4),
        status,
        state: r.get(6),
        elapsed_ms: r.get(7),
        result: r.get(8),
        error: r.get(9),
        created_at: r.get(10),
        updated_at: r.get(11),
    })
}

impl Store {
    /// Records a new run.
    pub async fn create_run(
        &self,
        id: &str,
        kind: RunKind,
        suite: Option<&str>,
        objective: Objective,
        config: &str,
    ) -> Result<(), StoreError> {
        let t = now();
        sqlx::query(
            "INSERT INTO runs (id, kind, suite, objective, config, status, state, elapsed_ms, result, error, \
             created_at, updated_at) VALUES ($1, $2, $3, $4, $5, 'running', NULL, 0, NULL, NULL, $6, $6)",
        )
        .bind(id)
        .bind(kind.as_str())
        .bind(suite)
        .bind(objective.as_str())
        .bind(config)
        .bind(t.as_str())
        .execute(self.pool())
        .await
        .map_err(q("creating a run"))?;
        Ok(())
    }

    /// Checkpoints a run's search state.
    pub async fn save_run_state(
        &self,
        id: &str,
        state: &str,
        elapsed_ms: i64,
        status: RunStatus,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE runs SET state = $1, elapsed_ms = $2, status = $3, updated_at = $4 WHERE id = $5",
        )
        .bind(state)
        .bind(elapsed_ms)
        .bind(status.as_str())
        .bind(now())
        .bind(id)
        .execute(self.pool())
        .await
        .map_err(q("checkpointing a run"))?;
        Ok(())
    }

    /// Records how a run ended.
    pub async fn finish_run(
        &self,
        id: &str,
        status: RunStatus,
        result: Option<&str>,
        error: Option<&str>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE runs SET status = $1, result = $2, error = $3, updated_at = $4 WHERE id = $5",
        )
        .bind(status.as_str())
        .bind(result)
        .bind(error)
        .bind(now())
        .bind(id)
        .execute(self.pool())
        .await
        .map_err(q("finishing a run"))?;
        Ok(())
    }

    /// Takes or renews the lease on run `id` for `owner`, valid for `ttl`. Returns the current holder instead
    /// when someone else holds an unexpired lease (`Ok(Err((owner, until)))`), and an error when the run does not
    /// exist.
    pub async fn lease_run(
        &self,
        id: &str,
        owner: &str,
        ttl: std::time::Duration,
    ) -> Result<Result<(), (String, String)>, StoreError> {
        let now_ = now();
        let until = (chrono::Utc::now()
            + chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::seconds(60)))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        // One conditional UPDATE, so two processes racing for a free run cannot both win it.
        let took = sqlx::query(
            "UPDATE runs SET lease_owner = $1, lease_until = $2 WHERE id = $3 \
             AND (lease_owner IS NULL OR lease_owner = $1 OR lease_until IS NULL OR lease_until < $4)",
        )
        .bind(owner)
        .bind(&until)
        .bind(id)
        .bind(&now_)
        .execute(self.pool())
        .await
        .map_err(q("taking a run's lease"))?
        .rows_affected();
        if took == 1 {
            return Ok(Ok(()));
        }
        let row: Option<(Option<String>, Option<String>)> =
            sqlx::query_as("SELECT lease_owner, lease_until FROM runs WHERE id = $1")
                .bind(id)
                .fetch_optional(self.pool())
                .await
                .map_err(q("reading a run's lease"))?;
        match row {
            None => Err(StoreError::NotFound {
                what: format!("run {id}"),
            }),
            Some((holder, until)) => {
                Ok(Err((holder.unwrap_or_default(), until.unwrap_or_default())))
            }
        }
    }

    /// Takes run `id`'s lease from `dead_holder`, whom the caller knows to be gone (a crashed process on this
    /// machine), for `owner`. False when the lease is no longer `dead_holder`'s.
    pub async fn take_over_run(
        &self,
        id: &str,
        dead_holder: &str,
        owner: &str,
        ttl: std::time::Duration,
    ) -> Result<bool, StoreError> {
        let until = (chrono::Utc::now()
            + chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::seconds(60)))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let took = sqlx::query(
            "UPDATE runs SET lease_owner = $1, lease_until = $2 WHERE id = $3 AND lease_owner = $4",
        )
        .bind(owner)
        .bind(&until)
        .bind(id)
        .bind(dead_holder)
        .execute(self.pool())
        .await
        .map_err(q("taking over a run's lease"))?
        .rows_affected();
        Ok(took == 1)
    }

    /// Gives up `owner`'s lease on run `id` (nothing happens when someone else holds it).
    pub async fn release_run(&self, id: &str, owner: &str) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE runs SET lease_owner = NULL, lease_until = NULL WHERE id = $1 AND lease_owner = $2",
        )
        .bind(id)
        .bind(owner)
        .execute(self.pool())
        .await
        .map_err(q("releasing a run's lease"))?;
        Ok(())
    }

    /// One run.
    pub async fn run(&self, id: &str) -> Result<Option<RunRow>, StoreError> {
        let row = sqlx::query(&format!("SELECT {RUN_COLS} FROM runs WHERE id = $1"))
            .bind(id)
            .fetch_optional(self.pool())
            .await
            .map_err(q("loading a run"))?;
        row.as_ref().map(run_row).transpose()
    }

    /// Runs, newest first.
    pub async fn runs(&self, limit: i64) -> Result<Vec<RunRow>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {RUN_COLS} FROM runs ORDER BY created_at DESC, id LIMIT $1"
        ))
        .bind(limit)
        .fetch_all(self.pool())
        .await
        .map_err(q("listing runs"))?;
        rows.iter().map(run_row).collect()
    }

    /// Stores one rollout's result; a result already stored under the same key is kept (the first one wins, so
    /// a resumed run never overwrites what it already had).
    pub async fn save_rollout(
        &self,
        run_id: &str,
        candidate_key: &str,
        task_id: &str,
        rollout: i64,
        result: &str,
        trajectory_id: Option<&str>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO run_rollouts (run_id, candidate_key, task_id, rollout, result, trajectory_id, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
        )
        .bind(run_id)
        .bind(candidate_key)
        .bind(task_id)
        .bind(rollout)
        .bind(result)
        .bind(trajectory_id)
        .bind(now())
        .execute(self.pool())
        .await
        .map_err(q("storing a rollout result"))?;
        Ok(())
    }

    /// Every stored rollout of a candidate in a run.
    pub async fn rollouts(
        &self,
        run_id: &str,
        candidate_key: &str,
    ) -> Result<Vec<RolloutRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT task_id, rollout, result, trajectory_id FROM run_rollouts \
             WHERE run_id = $1 AND candidate_key = $2 ORDER BY task_id, rollout",
        )
        .bind(run_id)
        .bind(candidate_key)
        .fetch_all(self.pool())
        .await
        .map_err(q("loading rollout results"))?;
        Ok(rows
            .iter()
            .map(|r| RolloutRow {
                task_id: r.get(0),
                rollout: r.get(1),
                result: r.get(2),
                trajectory_id: r.get(3),
            })
            .collect())
    }

    /// Every stored rollout of a run, each with the key of the candidate it belongs to, in key order: one query
    /// for a reader that shows every candidate (the report) rather than one per candidate.
    pub async fn run_rollouts(
        &self,
        run_id: &str,
    ) -> Result<Vec<(String, RolloutRow)>, StoreError> {
        let rows = sqlx::query(
            "SELECT candidate_key, task_id, rollout, result, trajectory_id FROM run_rollouts \
             WHERE run_id = $1 ORDER BY candidate_key, task_id, rollout",
        )
        .bind(run_id)
        .fetch_all(self.pool())
        .await
        .map_err(q("loading a run's rollout results"))?;
        Ok(rows
            .iter()
            .map(|r| {
                (
                    r.get(0),
                    RolloutRow {
                        task_id: r.get(1),
                        rollout: r.get(2),
                        result: r.get(3),
                        trajectory_id: r.get(4),
                    },
                )
            })
            .collect())
    }

    /// How many rollouts a run has stored.
    pub async fn count_rollouts(&self, run_id: &str) -> Result<i64, StoreError> {
        sqlx::query_scalar("SELECT COUNT(*) FROM run_rollouts WHERE run_id = $1")
            .bind(run_id)
            .fetch_one(self.pool())
            .await
            .map_err(q("counting rollouts"))
    }

    /// Stores a reflection's outcome under its key (first one wins).
    pub async fn save_proposal(
        &self,
        run_id: &str,
        key: &str,
        proposal: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO run_proposals (run_id, proposal_key, proposal, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT DO NOTHING",
        )
        .bind(run_id)
        .bind(key)
        .bind(proposal)
        .bind(now())
        .execute(self.pool())
        .await
        .map_err(q("storing a proposal"))?;
        Ok(())
    }

    /// A stored reflection, if this request was answered before.
    pub async fn proposal(&self, run_id: &str, key: &str) -> Result<Option<String>, StoreError> {
        sqlx::query_scalar(
            "SELECT proposal FROM run_proposals WHERE run_id = $1 AND proposal_key = $2",
        )
        .bind(run_id)
        .bind(key)
        .fetch_optional(self.pool())
        .await
        .map_err(q("loading a proposal"))
    }

    /// Appends a progress event; returns its sequence number.
    pub async fn push_event(&self, run_id: &str, event: &str) -> Result<i64, StoreError> {
        let seq: i64 = sqlx::query_scalar(
            "SELECT CAST(COALESCE(MAX(seq), -1) + 1 AS BIGINT) FROM run_events WHERE run_id = $1",
        )
        .bind(run_id)
        .fetch_one(self.pool())
        .await
        .map_err(q("numbering an event"))?;
        sqlx::query(
            "INSERT INTO run_events (run_id, seq, event, created_at) VALUES ($1, $2, $3, $4)",
        )
        .bind(run_id)
        .bind(seq)
        .bind(event)
        .bind(now())
        .execute(self.pool())
        .await
        .map_err(q("storing an event"))?;
        Ok(seq)
    }

    /// Events of a run from `after` (exclusive), in order.
    pub async fn events(&self, run_id: &str, after: i64) -> Result<Vec<(i64, String)>, StoreError> {
        let rows = sqlx::query(
            "SELECT seq, event FROM run_events WHERE run_id = $1 AND seq > $2 ORDER BY seq",
        )
        .bind(run_id)
        .bind(after)
        .fetch_all(self.pool())
        .await
        .map_err(q("loading events"))?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_run_reads_back_its_kind_status_and_objective_and_an_unknown_status_or_kind_is_named()
    {
        for s in [
            RunStatus::Running,
            RunStatus::Finished,
            RunStatus::Failed,
            RunStatus::Stopped,
        ] {
            assert_eq!(RunStatus::parse(s.as_str()), Some(s));
            assert_eq!(s.is_terminal(), s != RunStatus::Running);
        }
        for k in [RunKind::Optimize, RunKind::FromTraces] {
            assert_eq!(RunKind::parse(k.as_str()), Some(k));
            // The API shows the stored word.
            assert_eq!(
                serde_json::to_value(k).expect("serialises"),
                serde_json::json!(k.as_str())
            );
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path().join("r.db").to_str().expect("utf-8"))
            .await
            .expect("open");
        store
            .create_run("r1", RunKind::Optimize, None, Objective::Routing, "{}")
            .await
            .expect("create");
        let row = store.run("r1").await.expect("read").expect("stored");
        assert_eq!(
            (row.kind, row.status, row.objective),
            (RunKind::Optimize, RunStatus::Running, Objective::Routing)
        );
        store
            .finish_run("r1", RunStatus::Stopped, None, None)
            .await
            .expect("finish");
        assert_eq!(
            store.run("r1").await.expect("read").expect("stored").status,
            RunStatus::Stopped
        );
        // A row another version wrote with a status this one does not know: an error naming the run and the value.
        sqlx::query("UPDATE runs SET status = 'paused' WHERE id = 'r1'")
            .execute(store.pool())
            .await
            .expect("update");
        let e = store.run("r1").await.expect_err("unknown status");
        assert!(
            e.to_string().contains("stored run r1 is unreadable")
                && e.to_string().contains("\"paused\""),
            "{e}"
        );
        sqlx::query("UPDATE runs SET status = 'running', kind = 'sweep' WHERE id = 'r1'")
            .execute(store.pool())
            .await
            .expect("update");
        let e = store.run("r1").await.expect_err("unknown kind");
        assert!(e.to_string().contains("column `kind` is \"sweep\""), "{e}");
    }
}

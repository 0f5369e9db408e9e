//! The job queue: pgmq's, installed SQL-only into the store's own PostgreSQL (schema `pgmq`), so a deployment
//! needs no extension and no second service. A message is invisible for its visibility timeout once read, and
//! comes back when that passes without being archived: that is how a killed worker's jobs reach another.

use crate::WorkerError;
use crate::job::Job;
use pgmq::PGMQueueExt;
use sqlx::postgres::{PgPool, PgPoolOptions};
use std::collections::HashSet;
use std::time::Duration;

/// A message read from a queue.
#[derive(Debug, Clone)]
pub struct Taken {
    /// pgmq's message id.
    pub msg_id: i64,
    /// How many times it has been read, this read included.
    pub attempt: i32,
    /// The job, or why its JSON did not parse (a message written by another version).
    pub job: Result<Job, String>,
    /// The key, when the JSON held one (even if it is not a whole job), so a broken job can still be answered.
    pub key: Option<String>,
}

/// How many jobs wait in a queue and how many are being worked on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Depth {
    /// Visible: waiting for a worker.
    pub waiting: i64,
    /// Invisible: read by a worker that has not finished (or died and has not timed out yet).
    pub in_flight: i64,
}

/// A connection to the queues.
#[derive(Clone)]
pub struct Queue {
    pool: PgPool,
    pgmq: PGMQueueExt,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue").finish_non_exhaustive()
    }
}

/// Arbitrary, fixed: the advisory lock under which pgmq's SQL is installed, so that a driver and workers starting
/// together do not install it twice at once.
const INSTALL_LOCK: i64 = 0x7474_706d_7100;

fn q(doing: &'static str) -> impl FnOnce(pgmq::errors::PgmqError) -> WorkerError {
    move |e| WorkerError::Queue {
        doing,
        message: e.to_string(),
    }
}

fn s(doing: &'static str) -> impl FnOnce(sqlx::Error) -> WorkerError {
    move |e| WorkerError::Queue {
        doing,
        message: e.to_string(),
    }
}

impl Queue {
    /// Connects to the PostgreSQL at `url` and installs pgmq's SQL there if it is missing.
    pub async fn connect(url: &str) -> Result<Queue, WorkerError> {
        if !url.starts_with("postgres://") && !url.starts_with("postgresql://") {
            return Err(WorkerError::NotPostgres);
        }
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect(url)
            .await
            .map_err(|e| WorkerError::Connect {
                url: tooltune_store::redact_url(url),
                message: e.to_string(),
            })?;
        let mut conn = pool
            .acquire()
            .await
            .map_err(s("connecting for the install"))?;
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(INSTALL_LOCK)
            .execute(&mut *conn)
            .await
            .map_err(s("locking for the install"))?;
        let pgmq = PGMQueueExt::new_with_pool(pool.clone()).await;
        let installed = pgmq
            .install_sql_from_embedded()
            .await
            .map_err(q("installing pgmq's SQL"));
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(INSTALL_LOCK)
            .execute(&mut *conn)
            .await
            .map_err(s("unlocking after the install"))?;
        installed?;
        Ok(Queue { pool, pgmq })
    }

    /// Creates the queue if it does not exist.
    pub async fn ensure(&self, name: &str) -> Result<(), WorkerError> {
        self.pgmq
            .create(name)
            .await
            .map_err(q("creating a queue"))?;
        Ok(())
    }

    /// Sends jobs, in one transaction (all or none).
    pub async fn send(&self, name: &str, jobs: &[Job]) -> Result<(), WorkerError> {
        let mut tx = self.pool.begin().await.map_err(s("sending jobs"))?;
        for j in jobs {
            self.pgmq
                .send_with_cxn(name, j, &mut *tx)
                .await
                .map_err(q("sending a job"))?;
        }
        tx.commit().await.map_err(s("sending jobs"))?;
        Ok(())
    }

    /// Reads up to `max` jobs, each invisible to other readers for `visibility`.
    pub async fn read(
        &self,
        name: &str,
        visibility: Duration,
        max: usize,
    ) -> Result<Vec<Taken>, WorkerError> {
        let rows = sqlx::query_as::<_, (i64, i32, serde_json::Value)>(
            "SELECT msg_id, read_ct, message FROM pgmq.read(queue_name => $1::text, vt => $2::integer, \
             qty => $3::integer)",
        )
        .bind(name)
        .bind(secs(visibility))
        .bind(i32::try_from(max.max(1)).unwrap_or(i32::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(s("reading jobs"))?;
        Ok(rows
            .into_iter()
            .map(|(msg_id, attempt, message)| Taken {
                msg_id,
                attempt,
                key: message
                    .get("key")
                    .and_then(|k| k.as_str())
                    .map(str::to_string),
                job: serde_json::from_value(message).map_err(|e| e.to_string()),
            })
            .collect())
    }

    /// Keeps messages invisible for another `visibility` from now (a worker's heartbeat while it plays them).
    pub async fn extend(
        &self,
        name: &str,
        msg_ids: &[i64],
        visibility: Duration,
    ) -> Result<(), WorkerError> {
        self.set_vt(name, msg_ids, secs(visibility)).await
    }

    /// Makes messages visible again after `delay` (a job left for another attempt).
    pub async fn release(
        &self,
        name: &str,
        msg_ids: &[i64],
        delay: Duration,
    ) -> Result<(), WorkerError> {
        self.set_vt(name, msg_ids, secs(delay)).await
    }

    async fn set_vt(&self, name: &str, msg_ids: &[i64], vt: i32) -> Result<(), WorkerError> {
        for id in msg_ids {
            self.pgmq
                .set_vt::<serde_json::Value>(name, *id, vt)
                .await
                .map_err(q("setting a job's visibility"))?;
        }
        Ok(())
    }

    /// Moves finished messages to the queue's archive (pgmq keeps it; `tooltune serve` counts from it).
    pub async fn archive(&self, name: &str, msg_ids: &[i64]) -> Result<(), WorkerError> {
        if msg_ids.is_empty() {
            return Ok(());
        }
        self.pgmq
            .archive_batch(name, msg_ids)
            .await
            .map_err(q("archiving jobs"))?;
        Ok(())
    }

    /// How many jobs wait and how many are in flight.
    pub async fn depth(&self, name: &str) -> Result<Depth, WorkerError> {
        pgmq::util::check_input(name).map_err(q("naming a queue"))?;
        // The table name cannot be bound; it was checked above to be letters, digits and `_` only.
        let (waiting, in_flight) = sqlx::query_as::<_, (i64, i64)>(&format!(
            "SELECT count(*) FILTER (WHERE vt <= clock_timestamp()), \
             count(*) FILTER (WHERE vt > clock_timestamp()) FROM pgmq.q_{name}"
        ))
        .fetch_one(&self.pool)
        .await
        .map_err(s("counting jobs"))?;
        Ok(Depth { waiting, in_flight })
    }

    /// Which of `keys` have a message in the queue now (waiting or in flight), so that a resumed driver does not
    /// send them again.
    pub async fn queued_keys(
        &self,
        name: &str,
        keys: &[String],
    ) -> Result<HashSet<String>, WorkerError> {
        pgmq::util::check_input(name).map_err(q("naming a queue"))?;
        let rows = sqlx::query_scalar::<_, String>(&format!(
            "SELECT message->>'key' FROM pgmq.q_{name} WHERE message->>'key' = ANY($1)"
        ))
        .bind(keys)
        .fetch_all(&self.pool)
        .await
        .map_err(s("looking up queued jobs"))?;
        Ok(rows.into_iter().collect())
    }
}

fn secs(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

//! Rollouts as jobs on PostgreSQL (issue 30): an optimisation run started with workers sends each rollout and
//! screen it needs as a job to a pgmq queue in the store's own database, and `tooltune worker` processes on any
//! machine that has the model and the suite's server take them, play them and write the results back.
//!
//! - [`job`]: what a job is (pure): its content, the queue it belongs to, when to give it up, how jobs batch.
//! - [`queue`]: pgmq, installed SQL-only into the store's database.
//! - [`dispatch`]: the driver's side: send jobs, wait for results.
//! - [`work`]: the worker's loop.
//! - [`suites`]: how a worker finds the suite a job names.
//!
//! Results are written once under the job's key (the driver's content address of the rollout), with the
//! trajectory in the same row; the driver alone stores trajectories, so a job that ran twice is stored once.

pub mod dispatch;
pub mod job;
pub mod queue;
pub mod suites;
pub mod work;

pub use dispatch::{Dispatcher, WorkerPolicy};
pub use job::{Job, agent_identity, queue_name};
pub use queue::{Depth, Queue};
pub use work::{WorkerEvent, WorkerOptions, WorkerTotals, work};

/// `call`, a call to the store or the queue, abandoned after `limit` with [`WorkerError::TimedOut`]. sqlx checks
/// a connection whose query was abandoned before it serves again (and closes it if the check fails), so nothing
/// half-read is reused.
pub(crate) async fn bounded<T, E>(
    limit: std::time::Duration,
    doing: &'static str,
    call: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, WorkerError>
where
    WorkerError: From<E>,
{
    match tokio::time::timeout(limit, call).await {
        Ok(r) => r.map_err(WorkerError::from),
        Err(_) => Err(WorkerError::TimedOut {
            doing,
            seconds: limit.as_secs_f64(),
        }),
    }
}

/// Everything that can go wrong with jobs and workers.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// Workers need PostgreSQL: the queue lives in the store's database.
    #[error(
        "workers need a PostgreSQL store (--database-url postgres://...): the job queue lives in the store's \
         database"
    )]
    NotPostgres,
    /// The database did not answer.
    #[error("cannot connect to the job queue at {url}: {message}")]
    Connect {
        /// The URL, without its password.
        url: String,
        /// The driver's error.
        message: String,
    },
    /// A queue operation failed.
    #[error("job queue: {doing}: {message}")]
    Queue {
        /// What was being done.
        doing: &'static str,
        /// The error.
        message: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] tooltune_store::StoreError),
    /// The store or the queue did not answer in time: the link to the database may have gone silent (packets
    /// dropped without a reset, as across a broken route), which no socket error would ever report.
    #[error(
        "no answer from the store within {seconds:.0} s while {doing}; the network to the database may be down"
    )]
    TimedOut {
        /// What was being done.
        doing: &'static str,
        /// The limit.
        seconds: f64,
    },
    /// This machine cannot serve a suite.
    #[error("cannot serve suite `{suite}` ({digest}) here: {reason}")]
    CannotServe {
        /// The suite's name.
        suite: String,
        /// The start of its content address.
        digest: String,
        /// What is missing.
        reason: String,
    },
    /// A stop was asked for while jobs still waited for results (no worker running, say). The jobs stay queued:
    /// a resumed run sends nothing again and takes their results when workers have written them.
    #[error(
        "stopped while {waiting} jobs waited for results in queue {queue}; they stay queued, and resuming the run \
         uses what workers write meanwhile"
    )]
    Interrupted {
        /// Jobs without a result.
        waiting: usize,
        /// The queue they wait in.
        queue: String,
    },
}

//! The trace store: trajectories and content-addressed description versions in SQLite (default) or PostgreSQL.
//!
//! This is the only crate that knows SQL. It talks to both databases through sqlx's `Any` driver with one set of
//! queries, so the two backends cannot drift apart (except an import into a SQLite file, which writes through
//! SQLite's C API: see `import/sqlite.rs`); the schema lives in `migrations/{sqlite,postgres}` and is
//! applied on open. The store knows nothing about trace file formats beyond asking `tooltune-ingest` for parsed
//! chunks, and nothing about MCP or models.

mod body;
mod cache;
mod import;
mod jobs;
mod labels;
mod logged;
mod proxy;
mod runs;
mod stats;
pub mod variants;
mod writeback;

pub use cache::CachedResult;
pub use import::{ImportOptions, ImportProgress, ImportReport, PrepareOnly, SkippedRecord};
pub use jobs::{JobQueue, JobResult, JobSuite, WorkerRow};
pub use labels::{Failing, Label, LabelSource, LabelUse, NewLabel, Tally, ToLabel, VerdictCounts};
pub use logged::{LoggedFilter, LoggedVerdict};
pub use proxy::{NewProxySession, ProxyCall, SessionFacts, VariantToolCounts};
pub use runs::{RolloutRow, RunKind, RunRow, RunStatus};
pub use stats::ToolStats;

use sqlx::any::{AnyPoolOptions, install_default_drivers};
use sqlx::{AnyPool, Executor, Row};
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use tooltune_core::{DescriptionId, SinkError, ToolSpec, Trajectory, TrajectoryId, TrajectorySink};

/// Everything that can go wrong in the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database URL is neither `sqlite:`, `postgres:` nor a file path.
    #[error("unsupported database URL `{0}`: use a file path, sqlite://PATH or postgres://...")]
    BadUrl(String),
    /// The database URL or SQLite path is empty (an empty `--database-url` or `TOOLTUNE_DATABASE_URL`, say).
    #[error(
        "the database URL is empty: give a file path, sqlite://PATH or postgres://... (an empty \
         TOOLTUNE_DATABASE_URL counts as given)"
    )]
    EmptyUrl,
    /// Connecting or migrating failed.
    #[error("cannot open the trace store at {url}: {source}")]
    Open {
        /// The URL with any password removed.
        url: String,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
    /// Applying migrations failed.
    #[error("cannot migrate the trace store: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A query failed.
    #[error("trace store query failed while {doing}: {source}")]
    Query {
        /// What the store was doing.
        doing: &'static str,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
    /// Reading an input failed (IO, unknown format).
    #[error(transparent)]
    Ingest(#[from] tooltune_ingest::IngestError),
    /// A file held invalid records and was rejected whole; nothing of it was stored.
    #[error("{source_name}: {} invalid record(s), nothing stored (use --skip-invalid to store the valid ones):\n{}", .errors.len(), format_skipped(.source_name, .errors))]
    Rejected {
        /// The file or request the records came from.
        source_name: String,
        /// Every invalid record.
        errors: Vec<SkippedRecord>,
    },
    /// A row the caller named does not exist.
    #[error("{what} is not in the store")]
    NotFound {
        /// What was looked for.
        what: String,
    },
    /// A call of SQLite's C API failed (an import into a SQLite file writes through it).
    #[error("trace store query failed while {doing}: {message}")]
    Sqlite {
        /// What the store was doing.
        doing: &'static str,
        /// SQLite's message and code.
        message: String,
    },
    /// A stored run's row holds a status or objective this version does not know.
    #[error(
        "stored run {id} is unreadable: {message}; it was written by another version of tooltune or edited by hand"
    )]
    CorruptRun {
        /// The run id.
        id: String,
        /// What is wrong with its row.
        message: String,
    },
    /// A stored row could not be turned back into a trajectory.
    #[error("stored trajectory {id} is corrupt: {message}")]
    Corrupt {
        /// The trajectory id.
        id: String,
        /// What was wrong.
        message: String,
    },
}

fn format_skipped(source_name: &str, errors: &[SkippedRecord]) -> String {
    errors
        .iter()
        .map(|e| format!("  {source_name}:{}: {}", e.line, e.message))
        .collect::<Vec<_>>()
        .join("\n")
}

pub(crate) fn q(doing: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |source| StoreError::Query { doing, source }
}

/// Which database the store runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A local SQLite file.
    Sqlite,
    /// A PostgreSQL server.
    Postgres,
}

/// A handle to the trace store. Cheap to clone (a connection pool).
#[derive(Debug, Clone)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
    /// Body compression dictionaries already read or committed, by key (see `body.rs`).
    dictionaries: body::Dictionaries,
    /// The SQLite database file, whose disk writes a large import starts early (see `writeback.rs`).
    sqlite_file: Option<Arc<Path>>,
    /// The URL the store was opened with, for another connection to the same database (the job queue's).
    url: OpenedUrl,
}

/// A URL that may hold a password: its `Debug` form is redacted, so a logged `Store` never shows it.
#[derive(Clone)]
struct OpenedUrl(Arc<str>);

impl std::fmt::Debug for OpenedUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&redact_url(&self.0))
    }
}

/// How every SQLite connection is set up: the pool's (see `Store::open` for why each) and an import's own.
const SQLITE_PRAGMAS: &str = "PRAGMA page_size = 16384; \
    PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; \
    PRAGMA foreign_keys = ON; PRAGMA busy_timeout = 10000; \
    PRAGMA temp_store = MEMORY; PRAGMA cache_size = -32768;";

static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");
static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

/// Removes a password from a URL so that it can be shown in an error or a log line.
pub fn redact_url(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://")
        && let Some((creds, host)) = rest.split_once('@')
    {
        let user = creds.split(':').next().unwrap_or("");
        return format!("{scheme}://{user}:***@{host}");
    }
    url.to_string()
}

impl Store {
    /// Opens (creating and migrating on first use) the store at `url`: a file path or `sqlite://PATH` for SQLite,
    /// `postgres://...` for PostgreSQL.
    pub async fn open(url: &str) -> Result<Store, StoreError> {
        install_default_drivers();
        let (url, backend) = normalise_url(url)?;
        if backend == Backend::Sqlite
            && let Some(parent) = sqlite_path(&url).and_then(|p| Path::new(p).parent())
            && !parent.as_os_str().is_empty()
        {
            // Created here so that a fresh machine's first command works without a set-up step.
            std::fs::create_dir_all(parent).map_err(|e| StoreError::Open {
                url: url.clone(),
                source: sqlx::Error::Io(e),
            })?;
        }
        let mut opts = AnyPoolOptions::new().max_connections(match backend {
            // One writer at a time is all SQLite allows; a small pool still lets readers run beside it in WAL mode.
            Backend::Sqlite => 4,
            Backend::Postgres => 8,
        });
        if backend == Backend::Sqlite {
            // temp_store: a multi-row INSERT inside a long transaction keeps a statement journal; on disk, each one
            // was a temporary file created and unlinked, a tenth of the SQLite thread's time in a bulk ingest.
            // page_size (takes effect only when the file is created, before WAL mode is set): with 16 KiB pages a
            // bulk ingest makes a quarter of the reads and writes of WAL frames and checkpoint copies; 200,000
            // trajectories went from about 12 s to 10.8 s. (Before tool rows appended, in 0004, it was twice as
            // slow: each random-key insert then dirtied a page four times the size.)
            // cache_size (32 MiB, against SQLite's 2 MB): the unique index on trajectory ids takes inserts in
            // random order, and 200,000 ids fill about 16 MB of it. With the default cache most of those inserts
            // found their page spilled, so it was read back from the WAL and written to it again: an eighth of
            // the SQLite thread's samples were preads, a fifth pwrites. 200,000 trajectories: 14.2 s to 12.2-12.6
            // s (16 MiB: 12.7 s; 64 MiB: no better). The cache is a ceiling per connection, filled only as pages
            // are read, so an idle reader costs nothing; peak RSS of that import rose from 125 to 145 MB.
            opts = opts.after_connect(|conn, _| {
                Box::pin(async move {
                    conn.execute(SQLITE_PRAGMAS).await?;
                    Ok(())
                })
            });
        }
        let pool = opts
            .connect(&url)
            .await
            .map_err(|source| StoreError::Open {
                url: redact_url(&url),
                source,
            })?;
        match backend {
            Backend::Sqlite => SQLITE_MIGRATIONS.run(&pool).await?,
            Backend::Postgres => POSTGRES_MIGRATIONS.run(&pool).await?,
        }
        let sqlite_file = match backend {
            Backend::Sqlite => sqlite_path(&url).map(|p| Arc::from(Path::new(p))),
            Backend::Postgres => None,
        };
        Ok(Store {
            pool,
            backend,
            dictionaries: Default::default(),
            sqlite_file,
            url: OpenedUrl(Arc::from(url.as_str())),
        })
    }

    /// Closes every connection (waiting for those in use), e.g. before dropping a test database.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Which database this is.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The URL the store was opened with, for another client of the same database (the job queue of
    /// `tooltune-worker`). It may hold a password: show it only through [`redact_url`].
    pub fn database_url(&self) -> &str {
        &self.url.0
    }

    /// The connection pool, for other crates' own tables in later migrations. Kept crate-visible only through
    /// methods for now.
    pub(crate) fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// Stores already-validated trajectories (the evaluator's rollouts) in one transaction. Returns how many were
    /// new; a trajectory already present is left as it was.
    pub async fn insert(&self, trajectories: &[Trajectory]) -> Result<u64, StoreError> {
        for t in trajectories {
            if let Err(e) = t.validate() {
                return Err(StoreError::Rejected {
                    source_name: "insert".into(),
                    errors: vec![SkippedRecord {
                        line: 0,
                        message: e.to_string(),
                    }],
                });
            }
        }
        let mut w = import::Writer::begin(self).await?;
        let added = w.write(trajectories).await?;
        w.commit().await?;
        Ok(added)
    }

    /// Number of stored trajectories.
    pub async fn count_trajectories(&self) -> Result<u64, StoreError> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM trajectories")
            .fetch_one(&self.pool)
            .await
            .map_err(q("counting trajectories"))?;
        Ok(n as u64)
    }

    /// Number of stored description versions.
    pub async fn count_descriptions(&self) -> Result<u64, StoreError> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM descriptions")
            .fetch_one(&self.pool)
            .await
            .map_err(q("counting descriptions"))?;
        Ok(n as u64)
    }

    /// The body compression dictionary stored under `key`, from the cache or else from `db`. `None` if there is
    /// no such row.
    pub(crate) async fn dictionary<'c, E>(
        &self,
        db: E,
        key: u32,
    ) -> Result<Option<Arc<body::Dictionary>>, StoreError>
    where
        E: sqlx::Executor<'c, Database = sqlx::Any>,
    {
        if let Some(d) = self.dictionaries.get(key) {
            return Ok(Some(d));
        }
        let bytes: Option<Vec<u8>> =
            sqlx::query_scalar("SELECT dictionary FROM body_dictionaries WHERE key = $1")
                .bind(i64::from(key))
                .fetch_optional(db)
                .await
                .map_err(q("reading a compression dictionary"))?;
        Ok(bytes.map(|b| self.dictionaries.insert_stored(key, &b)))
    }

    /// Loads one trajectory, with its tool list rebuilt from the stored description versions.
    pub async fn trajectory(&self, id: &TrajectoryId) -> Result<Option<Trajectory>, StoreError> {
        // SQLite bodies may be compressed bytes (see `body.rs`); read them as bytes whatever their type.
        let sql = match self.backend {
            Backend::Sqlite => "SELECT CAST(body AS BLOB) FROM trajectories WHERE id = $1",
            Backend::Postgres => "SELECT body FROM trajectories WHERE id = $1",
        };
        let row = sqlx::query(sql)
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(q("loading a trajectory"))?;
        let Some(row) = row else { return Ok(None) };
        let corrupt = |message: String| StoreError::Corrupt {
            id: id.to_string(),
            message,
        };
        let mut t: Trajectory = match self.backend {
            Backend::Sqlite => {
                let stored: Vec<u8> = row.get(0);
                let dictionary = match body::codec(&stored) {
                    body::Codec::Zstd(Some(key)) => self.dictionary(&self.pool, key).await?,
                    _ => None,
                };
                let json = body::decode(&stored, dictionary.as_deref()).map_err(corrupt)?;
                serde_json::from_slice(&json)
            }
            Backend::Postgres => serde_json::from_str(&row.get::<String, _>(0)),
        }
        .map_err(|e| corrupt(e.to_string()))?;
        let tools = sqlx::query(
            "SELECT d.tool, d.description, d.input_schema FROM trajectory_tools tt \
             JOIN trajectories t ON t.seq = tt.trajectory_seq \
             JOIN descriptions d ON d.key = tt.description_key \
             WHERE t.id = $1 ORDER BY tt.position",
        )
        .bind(id.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(q("loading a trajectory's tools"))?;
        t.tools = tools
            .into_iter()
            .map(|r| {
                let schema: String = r.get(2);
                Ok(ToolSpec {
                    name: r.get(0),
                    description: r.get(1),
                    input_schema: serde_json::from_str(&schema).map_err(|e| {
                        StoreError::Corrupt {
                            id: id.to_string(),
                            message: format!("input schema: {e}"),
                        }
                    })?,
                })
            })
            .collect::<Result<_, StoreError>>()?;
        Ok(Some(t))
    }

    /// Ids of trajectories, newest ingest first, optionally only those that showed a tool.
    pub async fn trajectory_ids(
        &self,
        tool: Option<&str>,
        limit: u64,
    ) -> Result<Vec<TrajectoryId>, StoreError> {
        let rows = match tool {
            Some(tool) => sqlx::query(
                "SELECT t.id FROM trajectories t JOIN trajectory_tools tt ON tt.trajectory_seq = t.seq \
                 JOIN descriptions d ON d.key = tt.description_key \
                 WHERE d.tool = $1 ORDER BY t.seq DESC LIMIT $2",
            )
            .bind(tool.to_string())
            .bind(limit as i64)
            .fetch_all(&self.pool)
            .await,
            None => sqlx::query(
                "SELECT id FROM trajectories ORDER BY seq DESC LIMIT $1",
            )
            .bind(limit as i64)
            .fetch_all(&self.pool)
            .await,
        }
        .map_err(q("listing trajectories"))?;
        Ok(rows
            .into_iter()
            .map(|r| TrajectoryId::from_stored(r.get(0)))
            .collect())
    }

    /// Trajectories that showed `tool` and were judged, newest first: `(failing ids, how many were judged)`.
    /// Only ingests at or after `since` (RFC 3339, or a date `YYYY-MM-DD`) count when it is given; the evaluator's
    /// own rollouts (`source = 'evaluator'`) never do, since they are not logs of real use.
    pub async fn failing_for_tool(
        &self,
        tool: &str,
        since: Option<&str>,
        limit: u64,
    ) -> Result<(Vec<TrajectoryId>, u64), StoreError> {
        let since = since.unwrap_or("");
        let failing = sqlx::query(
            "SELECT t.id FROM trajectories t JOIN trajectory_tools tt ON tt.trajectory_seq = t.seq \
             JOIN descriptions d ON d.key = tt.description_key \
             WHERE d.tool = $1 AND t.success = 0 AND t.ingested_at >= $2 AND t.source <> 'evaluator' \
             ORDER BY t.seq DESC LIMIT $3",
        )
        .bind(tool.to_string())
        .bind(since.to_string())
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(q("listing failing trajectories"))?;
        let judged = sqlx::query(
            "SELECT COUNT(*) FROM trajectories t JOIN trajectory_tools tt ON tt.trajectory_seq = t.seq \
             JOIN descriptions d ON d.key = tt.description_key \
             WHERE d.tool = $1 AND t.success IS NOT NULL AND t.ingested_at >= $2 \
             AND t.source <> 'evaluator'",
        )
        .bind(tool.to_string())
        .bind(since.to_string())
        .fetch_one(&self.pool)
        .await
        .map_err(q("counting judged trajectories"))?;
        let judged: i64 = judged.get(0);
        Ok((
            failing
                .into_iter()
                .map(|r| TrajectoryId::from_stored(r.get(0)))
                .collect(),
            judged.max(0) as u64,
        ))
    }

    /// The text of a stored description version.
    pub async fn description(&self, id: &DescriptionId) -> Result<Option<ToolSpec>, StoreError> {
        let row =
            sqlx::query("SELECT tool, description, input_schema FROM descriptions WHERE id = $1")
                .bind(id.as_str())
                .fetch_optional(&self.pool)
                .await
                .map_err(q("loading a description"))?;
        row.map(|r| {
            let schema: String = r.get(2);
            Ok(ToolSpec {
                name: r.get(0),
                description: r.get(1),
                input_schema: serde_json::from_str(&schema).map_err(|e| StoreError::Corrupt {
                    id: id.to_string(),
                    message: e.to_string(),
                })?,
            })
        })
        .transpose()
    }
}

fn normalise_url(url: &str) -> Result<(String, Backend), StoreError> {
    // SQLite opens an empty path as a private temporary database per connection: every query of the pool would
    // see another empty store ("no such table"), so an empty URL is refused here.
    let path = url
        .strip_prefix("sqlite:")
        .map_or(url, |r| r.trim_start_matches("//"));
    if path.split('?').next().unwrap_or("").trim().is_empty() {
        return Err(StoreError::EmptyUrl);
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok((url.to_string(), Backend::Postgres));
    }
    if let Some(rest) = url.strip_prefix("sqlite:") {
        let rest = rest.trim_start_matches("//");
        let mut s = format!("sqlite://{rest}");
        if !rest.contains("mode=") && rest != ":memory:" {
            s.push_str(if rest.contains('?') {
                "&mode=rwc"
            } else {
                "?mode=rwc"
            });
        }
        return Ok((s, Backend::Sqlite));
    }
    if url.contains("://") {
        return Err(StoreError::BadUrl(redact_url(url)));
    }
    // A bare path is a SQLite file.
    Ok((format!("sqlite://{url}?mode=rwc"), Backend::Sqlite))
}

fn sqlite_path(url: &str) -> Option<&str> {
    let rest = url.strip_prefix("sqlite://")?;
    let path = rest.split('?').next()?;
    (path != ":memory:").then_some(path)
}

impl FromStr for Backend {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        normalise_url(s).map(|(_, b)| b)
    }
}

/// The evaluator's rollouts go into the store through this: each chunk is one `insert` (validated, all or nothing).
impl TrajectorySink for Store {
    fn write<'a>(
        &'a self,
        chunk: &'a [Trajectory],
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<(), SinkError>> + Send + 'a>> {
        Box::pin(async move {
            self.insert(chunk).await?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_normalised_and_redacted() {
        assert_eq!(
            normalise_url("traces.db").expect("path"),
            ("sqlite://traces.db?mode=rwc".into(), Backend::Sqlite)
        );
        assert_eq!(
            normalise_url("sqlite:///tmp/x.db").expect("url").1,
            Backend::Sqlite
        );
        assert_eq!(
            normalise_url("postgres://u:p@h/db").expect("pg").1,
            Backend::Postgres
        );
        assert!(normalise_url("mysql://h/db").is_err());
        for empty in ["", "  ", "sqlite:", "sqlite://", "sqlite://?mode=rwc"] {
            assert!(
                matches!(normalise_url(empty), Err(StoreError::EmptyUrl)),
                "{empty:?}"
            );
        }
        assert_eq!(
            redact_url("postgres://u:secret@h/db"),
            "postgres://u:***@h/db"
        );
        assert_eq!(sqlite_path("sqlite://a/b.db?mode=rwc"), Some("a/b.db"));
    }
}

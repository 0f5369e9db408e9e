//! The trace store against both backends: a SQLite file and the PostgreSQL that `scripts/test` starts
//! (`TOOLTUNE_TEST_POSTGRES_URL`), each test in a fresh database.

use serde_json::json;
use std::io::Cursor;
use tooltune_core::{ToolAnnotations, Trajectory};
use tooltune_ingest::{ChunkReader, Format, FormatChoice, ReadOptions};
use tooltune_store::{ImportOptions, Store, StoreError};

/// A fresh store on one backend; dropping the PostgreSQL database is best-effort at the end of each test.
struct TestDb {
    store: Store,
    pg_admin: Option<(String, String)>,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    /// Imports `ts` as one tooltune JSONL file.
    async fn import(&self, ts: &[Trajectory]) -> Result<tooltune_store::ImportReport, StoreError> {
        self.store
            .import(
                reader(jsonl(ts)),
                "t.jsonl",
                ImportOptions::default(),
                |_| {},
            )
            .await
    }

    /// A connection of the test's own to its SQLite file, to look at or change the tables directly.
    async fn sqlite_pool(&self) -> sqlx::AnyPool {
        let dir = self._dir.as_ref().expect("a SQLite store");
        let url = format!("sqlite://{}", dir.path().join("t.sqlite").display());
        sqlx::any::AnyPoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await
            .expect("connect")
    }

    async fn finish(self) {
        self.store.close().await;
        if let Some((admin, name)) = self.pg_admin {
            // Best-effort: the cluster is a throwaway one, so a leftover database costs only disk.
            let _ = drop_pg_database(&admin, &name).await;
        }
    }
}

fn admin_url_string() -> String {
    std::env::var("TOOLTUNE_TEST_POSTGRES_URL").expect(
        "TOOLTUNE_TEST_POSTGRES_URL must name a PostgreSQL server: run the tests through scripts/test, which starts one",
    )
}

async fn drop_pg_database(admin: &str, name: &str) -> Result<(), sqlx::Error> {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(admin).await?;
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&mut c)
        .await?;
    Ok(())
}

async fn sqlite() -> TestDb {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(&dir.path().join("t.sqlite").display().to_string())
        .await
        .expect("open sqlite");
    TestDb {
        store,
        pg_admin: None,
        _dir: Some(dir),
    }
}

/// A fresh, empty PostgreSQL database: (admin URL, database name, the database's URL).
async fn new_pg_database() -> (String, String, String) {
    use sqlx::Connection;
    let admin = admin_url_string();
    let name = format!("tooltune_test_{}", uuid::Uuid::new_v4().simple());
    let mut c = sqlx::PgConnection::connect(&admin)
        .await
        .expect("connect to the test PostgreSQL");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut c)
        .await
        .expect("create test database");
    let (base, _) = admin.rsplit_once('/').expect("URL with a database path");
    let url = format!("{base}/{name}");
    (admin, name, url)
}

async fn postgres() -> TestDb {
    let (admin, name, url) = new_pg_database().await;
    let store = Store::open(&url).await.expect("open postgres");
    TestDb {
        store,
        pg_admin: Some((admin, name)),
        _dir: None,
    }
}

fn trajectory(task: &str, called: &[&str], success: bool, docs_description: &str) -> Trajectory {
    let steps: Vec<_> = called
        .iter()
        .enumerate()
        .flat_map(|(i, name)| {
            [
                json!({"type": "model", "tool_calls": [{"id": format!("c{i}"), "name": name, "arguments": {"q": task}}]}),
                json!({"type": "tool_result", "call_id": format!("c{i}"), "name": name, "content": "result"}),
            ]
        })
        .collect();
    serde_json::from_value(json!({
        "task": task,
        "tools": [
            {"name": "search_docs", "description": docs_description, "input_schema": {"type": "object"}},
            {"name": "web_search", "description": "Search the web.", "input_schema": {"type": "object"}}
        ],
        "steps": steps,
        "final_answer": "done",
        "outcome": {"success": success},
        "meta": {"source": "tooltune"}
    }))
    .expect("test trajectory")
}

fn jsonl(ts: &[Trajectory]) -> String {
    ts.iter()
        .map(|t| serde_json::to_string(t).expect("serialise"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn reader(text: String) -> ChunkReader<Cursor<Vec<u8>>> {
    reader_with(text, ReadOptions::default())
}

fn reader_with(text: String, opts: ReadOptions) -> ChunkReader<Cursor<Vec<u8>>> {
    ChunkReader::new(
        Cursor::new(text.into_bytes()),
        "test.jsonl",
        FormatChoice::Fixed(Format::Tooltune),
        opts,
    )
    .expect("reader")
}

fn sample() -> Vec<Trajectory> {
    vec![
        trajectory(
            "retry limit of the billing SDK",
            &["search_docs"],
            true,
            "Search internal docs.",
        ),
        trajectory(
            "what sync_orders returns",
            &["web_search"],
            false,
            "Search internal docs.",
        ),
        trajectory(
            "weather in Paris",
            &["web_search"],
            true,
            "Search internal docs.",
        ),
        trajectory(
            "on-call runbook for db failover",
            &["search_docs", "search_docs"],
            false,
            "Search the engineering handbook and SDK references.",
        ),
        trajectory(
            "World Cup winner",
            &[],
            false,
            "Search the engineering handbook and SDK references.",
        ),
    ]
}

/// Loads `t` back from the store and checks it comes back whole, tool list included.
async fn assert_reads_back(s: &Store, t: &Trajectory) {
    let back = s.trajectory(&t.id()).await.expect("load").expect("present");
    assert_eq!(&back, t);
}

async fn import_then_stats(db: TestDb) {
    let s = &db.store;
    let report = s
        .import(
            reader(jsonl(&sample())),
            "test.jsonl",
            ImportOptions::default(),
            |_| {},
        )
        .await
        .expect("import");
    assert_eq!(
        (report.records, report.added, report.already_present),
        (5, 5, 0)
    );
    // Three description versions: two of search_docs, one of web_search, each stored once.
    assert_eq!(s.count_descriptions().await.expect("count"), 3);
    let stats = s.tool_stats(None).await.expect("stats");
    let total = |tool: &str| {
        stats
            .iter()
            .find(|r| r.tool == tool && r.description_id.is_none())
            .expect("total row")
            .clone()
    };
    let docs = total("search_docs");
    assert_eq!((docs.shown, docs.chosen, docs.calls), (5, 2, 3));
    assert_eq!(
        (
            docs.success_when_chosen.hits,
            docs.success_when_chosen.trials
        ),
        (1, 2)
    );
    let web = total("web_search");
    assert_eq!((web.shown, web.chosen, web.calls), (5, 2, 2));
    assert_eq!(
        (web.success_when_chosen.hits, web.success_when_chosen.trials),
        (1, 2)
    );
    let versions: Vec<_> = stats
        .iter()
        .filter(|r| r.tool == "search_docs" && r.description_id.is_some())
        .map(|r| (r.shown, r.chosen))
        .collect();
    assert_eq!(versions, vec![(3, 1), (2, 1)]);
    let web_share = web.selection_share;
    assert!(web_share.low < 0.4 && web_share.high > 0.4, "{web_share:?}");

    // The same file again adds nothing.
    let again = s
        .import(
            reader(jsonl(&sample())),
            "test.jsonl",
            ImportOptions::default(),
            |_| {},
        )
        .await
        .expect("re-import");
    assert_eq!((again.added, again.already_present), (0, 5));
    assert_eq!(s.count_trajectories().await.expect("count"), 5);

    // A stored trajectory comes back whole, tool list included.
    assert_reads_back(s, &sample()[3]).await;
    db.finish().await;
}

async fn invalid_file_is_rejected_whole(db: TestDb) {
    let s = &db.store;
    let mut text = jsonl(&sample());
    text.push_str("\n{\"task\": \"truncated\", \"tools\": [");
    text.push('\n');
    text.push_str(
        &serde_json::to_string(&trajectory("later good one", &["web_search"], true, "x"))
            .expect("json"),
    );
    let err = s
        .import(
            reader(text.clone()),
            "bad.jsonl",
            ImportOptions::default(),
            |_| {},
        )
        .await
        .expect_err("rejected");
    match &err {
        StoreError::Rejected { errors, .. } => {
            assert_eq!(errors.len(), 1);
            assert_eq!(errors[0].line, 6);
        }
        other => panic!("expected Rejected, got {other}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("bad.jsonl:6"), "{msg}");
    assert_eq!(s.count_trajectories().await.expect("count"), 0);
    assert_eq!(s.count_descriptions().await.expect("count"), 0);

    let report = s
        .import(
            reader(text),
            "bad.jsonl",
            ImportOptions { skip_invalid: true },
            |_| {},
        )
        .await
        .expect("skip invalid");
    assert_eq!(
        (report.records, report.added, report.skipped.len()),
        (7, 6, 1)
    );
    assert_eq!(report.skipped[0].line, 6);
    assert_eq!(s.count_trajectories().await.expect("count"), 6);
    db.finish().await;
}

async fn insert_keeps_run_links(db: TestDb) {
    let s = &db.store;
    let mut t = trajectory(
        "evaluated task",
        &["search_docs"],
        true,
        "Search internal docs.",
    );
    t.links.run_id = Some("run-1".into());
    t.links.candidate_id = Some("cand-2".into());
    t.links.rollout = Some(0);
    assert_eq!(s.insert(std::slice::from_ref(&t)).await.expect("insert"), 1);
    assert_eq!(s.insert(std::slice::from_ref(&t)).await.expect("insert"), 0);
    let back = s.trajectory(&t.id()).await.expect("load").expect("present");
    assert_eq!(back.links, t.links);
    db.finish().await;
}

/// A trajectory of `trajectory`'s shape with the server's hints for both tools.
fn with_hints(task: &str) -> Trajectory {
    let mut t = trajectory(task, &["web_search"], true, "Search internal docs.");
    t.tool_annotations.insert(
        "search_docs".into(),
        ToolAnnotations {
            read_only_hint: Some(true),
            open_world_hint: Some(false),
            ..Default::default()
        },
    );
    t.tool_annotations.insert(
        "web_search".into(),
        ToolAnnotations {
            read_only_hint: Some(false),
            destructive_hint: Some(false),
            idempotent_hint: Some(true),
            open_world_hint: Some(true),
        },
    );
    t
}

/// Tool hints are kept with the trajectory, whichever way it comes in (the evaluator's `insert`; an import, which
/// on SQLite is the C API writer), and read back with the same id; they are not part of a description version.
async fn tool_annotations_are_kept_and_read_back(db: TestDb) {
    let s = &db.store;
    let inserted = with_hints("inserted with hints");
    assert_eq!(
        s.insert(std::slice::from_ref(&inserted))
            .await
            .expect("insert"),
        1
    );
    let imported = with_hints("imported with hints");
    let plain = trajectory(
        "imported without hints",
        &["web_search"],
        true,
        "Search internal docs.",
    );
    let report = db
        .import(&[imported.clone(), plain.clone()])
        .await
        .expect("import");
    assert_eq!(report.added, 2);
    for t in [&inserted, &imported, &plain] {
        let back = s.trajectory(&t.id()).await.expect("load").expect("present");
        assert_eq!(&back, t);
        assert_eq!(back.id(), t.id());
    }
    // Hints or none, the same text and schema are the same two description versions.
    assert_eq!(s.count_descriptions().await.expect("count"), 2);
    // The same record again, now without its hints, is another record.
    let mut stripped = imported.clone();
    stripped.tool_annotations.clear();
    assert_ne!(stripped.id(), imported.id());
    assert!(s.trajectory(&stripped.id()).await.expect("load").is_none());
    db.finish().await;
}

#[tokio::test]
async fn sqlite_tool_annotations_are_kept_and_read_back() {
    tool_annotations_are_kept_and_read_back(sqlite().await).await;
}
#[tokio::test]
async fn postgres_tool_annotations_are_kept_and_read_back() {
    tool_annotations_are_kept_and_read_back(postgres().await).await;
}

#[tokio::test]
async fn sqlite_import_then_stats() {
    import_then_stats(sqlite().await).await;
}
#[tokio::test]
async fn postgres_import_then_stats() {
    import_then_stats(postgres().await).await;
}
#[tokio::test]
async fn sqlite_invalid_file_is_rejected_whole() {
    invalid_file_is_rejected_whole(sqlite().await).await;
}
#[tokio::test]
async fn postgres_invalid_file_is_rejected_whole() {
    invalid_file_is_rejected_whole(postgres().await).await;
}
#[tokio::test]
async fn sqlite_insert_keeps_run_links() {
    insert_keeps_run_links(sqlite().await).await;
}
#[tokio::test]
async fn postgres_insert_keeps_run_links() {
    insert_keeps_run_links(postgres().await).await;
}

/// `run_rollouts` gives every rollout of one run (and none of another), each under its candidate's key.
async fn a_runs_rollouts_come_with_their_candidate_keys(db: TestDb) {
    let s = &db.store;
    for run in ["run-a", "run-b"] {
        s.create_run(
            run,
            tooltune_store::RunKind::Optimize,
            None,
            tooltune_objectives::Objective::TaskSuccess,
            "{}",
        )
        .await
        .expect("create run");
    }
    let rows = [
        ("run-a", "cand-2", "t1", 0, Some("traj-1")),
        ("run-a", "cand-1", "t2", 1, None),
        ("run-a", "cand-1", "t1", 0, None),
        ("run-b", "cand-1", "t1", 0, None),
    ];
    for (run, key, task, rollout, trajectory) in rows {
        let result = format!(r#"{{"task_id":"{task}","run":"{run}"}}"#);
        s.save_rollout(run, key, task, rollout, &result, trajectory)
            .await
            .expect("save");
    }
    let got: Vec<(String, String, i64, String, Option<String>)> = s
        .run_rollouts("run-a")
        .await
        .expect("rollouts")
        .into_iter()
        .map(|(k, r)| (k, r.task_id, r.rollout, r.result, r.trajectory_id))
        .collect();
    let row = |k: &str, t: &str, n: i64, traj: Option<&str>| {
        (
            k.to_string(),
            t.to_string(),
            n,
            format!(r#"{{"task_id":"{t}","run":"run-a"}}"#),
            traj.map(str::to_string),
        )
    };
    assert_eq!(
        got,
        [
            row("cand-1", "t1", 0, None),
            row("cand-1", "t2", 1, None),
            row("cand-2", "t1", 0, Some("traj-1")),
        ]
    );
    assert!(s.run_rollouts("run-c").await.expect("none").is_empty());
    db.finish().await;
}

#[tokio::test]
async fn sqlite_a_runs_rollouts_come_with_their_candidate_keys() {
    a_runs_rollouts_come_with_their_candidate_keys(sqlite().await).await;
}
#[tokio::test]
async fn postgres_a_runs_rollouts_come_with_their_candidate_keys() {
    a_runs_rollouts_come_with_their_candidate_keys(postgres().await).await;
}

/// A run's lease: one holder at a time, renewable by its holder, free again once released or expired, and
/// taken over from a named dead holder only while that holder still has it.
async fn run_lease_has_one_holder(db: TestDb) {
    use std::time::Duration;
    let s = &db.store;
    s.create_run(
        "run-l",
        tooltune_store::RunKind::Optimize,
        None,
        tooltune_objectives::Objective::TaskSuccess,
        "{}",
    )
    .await
    .expect("create run");
    let long = Duration::from_secs(60);
    assert_eq!(
        s.lease_run("run-l", "a", long).await.expect("lease"),
        Ok(())
    );
    assert_eq!(
        s.lease_run("run-l", "a", long).await.expect("renew"),
        Ok(())
    );
    let busy = s.lease_run("run-l", "b", long).await.expect("lease");
    assert_eq!(busy.map_err(|(holder, _)| holder), Err("a".to_string()));
    // Releasing by someone else does nothing; by the holder frees the run.
    s.release_run("run-l", "b").await.expect("release");
    assert!(
        s.lease_run("run-l", "b", long)
            .await
            .expect("lease")
            .is_err()
    );
    s.release_run("run-l", "a").await.expect("release");
    assert_eq!(
        s.lease_run("run-l", "b", long).await.expect("lease"),
        Ok(())
    );
    // An expired lease is free.
    assert_eq!(
        s.lease_run("run-l", "b", Duration::ZERO)
            .await
            .expect("lease"),
        Ok(())
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        s.lease_run("run-l", "c", long).await.expect("lease"),
        Ok(())
    );
    // Taking over works only from the holder named.
    assert!(
        !s.take_over_run("run-l", "b", "d", long)
            .await
            .expect("take over")
    );
    assert!(
        s.take_over_run("run-l", "c", "d", long)
            .await
            .expect("take over")
    );
    assert!(
        s.lease_run("run-l", "c", long)
            .await
            .expect("lease")
            .is_err()
    );
    // A run that does not exist is an error naming it.
    let e = s
        .lease_run("run-none", "a", long)
        .await
        .expect_err("no such run");
    assert!(e.to_string().contains("run-none"), "{e}");
    db.finish().await;
}

#[tokio::test]
async fn sqlite_run_lease_has_one_holder() {
    run_lease_has_one_holder(sqlite().await).await;
}
#[tokio::test]
async fn postgres_run_lease_has_one_holder() {
    run_lease_has_one_holder(postgres().await).await;
}

/// Migration 0004 re-keys `trajectory_tools` by a trajectory sequence number: a store written before it keeps
/// every tool list, and new trajectories number on from the old ones.
#[tokio::test]
async fn sqlite_store_from_before_0004_keeps_its_tool_lists_and_plain_bodies() {
    use sqlx::Executor;
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("old.db").display());
    {
        let pool = migrated_before(&url, "sqlite", "0004").await;
        pool.execute(
            "INSERT INTO descriptions VALUES ('d1', 'read_file', 'Read a file.', '{}', '2026-01-01T00:00:00Z'), \
                 ('d2', 'calculator', 'Add.', '{}', '2026-01-01T00:00:00Z'); \
             INSERT INTO trajectories (id, source, task, ingested_at, body) VALUES ('t1', 'tooltune', 'Sum', \
                 '2026-01-01T00:00:00Z', '{\"task\":\"Sum\",\"steps\":[],\"outcome\":{},\"meta\":{\"source\":\"tooltune\"}}'); \
             INSERT INTO trajectory_tools VALUES ('t1', 0, 'd1', 'read_file', 1), ('t1', 1, 'd2', 'calculator', 0);",
        )
        .await
        .expect("old rows");
        pool.close().await;
    }
    let s = Store::open(&url).await.expect("open migrates");
    let t = s
        .trajectory(&tooltune_core::TrajectoryId::from_stored("t1".into()))
        .await
        .expect("load")
        .expect("present");
    let names: Vec<_> = t.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["read_file", "calculator"]);
    let stats = s.tool_stats(Some("read_file")).await.expect("stats");
    assert_eq!((stats[0].shown, stats[0].chosen), (1, 1));
    // A trajectory stored after the migration gets its own tool list, and the old one keeps its own.
    a_new_copy_reads_back(&s, &t).await;
    let stats = s.tool_stats(Some("read_file")).await.expect("stats");
    assert_eq!(stats[0].shown, 2);
    s.close().await;
    // The old body stays plain JSON text and the new one is stored compressed; both read back above.
    let pool = sqlx::any::AnyPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .expect("connect");
    let kinds: Vec<String> =
        sqlx::query_scalar("SELECT typeof(body) FROM trajectories ORDER BY seq")
            .fetch_all(&pool)
            .await
            .expect("kinds");
    assert_eq!(kinds, ["text", "blob"]);
    pool.close().await;
}

/// A connection to the database at `url` with the schema an older tooltune left: the migrations of `dialect`
/// numbered below `before`, applied from a folder of their own.
async fn migrated_before(url: &str, dialect: &str, before: &str) -> sqlx::AnyPool {
    let old = tempfile::tempdir().expect("tempdir");
    let all = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../migrations")
        .join(dialect);
    for e in std::fs::read_dir(&all).expect("migrations") {
        let name = e.expect("entry").file_name();
        if name.to_string_lossy().as_ref() < before {
            std::fs::copy(all.join(&name), old.path().join(&name)).expect("copy");
        }
    }
    sqlx::any::install_default_drivers();
    let pool = sqlx::any::AnyPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .expect("connect");
    sqlx::migrate::Migrator::new(old.path())
        .await
        .expect("old migrations")
        .run(&pool)
        .await
        .unwrap_or_else(|e| panic!("migrate to before {before}: {e}"));
    pool
}

/// Stores a copy of `t` (another task) in a migrated store and reads it back: it gets its own tool list, the same
/// as `t`'s. Returns the copy.
async fn a_new_copy_reads_back(s: &Store, t: &Trajectory) -> Trajectory {
    let mut fresh = t.clone();
    fresh.task = "Sum again".into();
    assert_eq!(
        s.insert(std::slice::from_ref(&fresh))
            .await
            .expect("insert"),
        1
    );
    let back = s
        .trajectory(&fresh.id())
        .await
        .expect("load")
        .expect("present");
    assert_eq!(back.tools, t.tools);
    assert_eq!(back.task, "Sum again");
    fresh
}

/// Migration 0006 gives description versions integer keys and drops the tool name from tool rows (and, on SQLite,
/// makes the sequence number the rowid): a store written before it keeps every tool list and statistic, and new
/// trajectories number on from the old ones.
async fn store_from_before_0006_keeps_its_tool_lists(url: &str, dialect: &str) {
    use sqlx::Executor;
    {
        let pool = migrated_before(url, dialect, "0006").await;
        let seq_column = if dialect == "sqlite" { ", seq" } else { "" };
        let seq_value = |n: u32| {
            if dialect == "sqlite" {
                format!(", {n}")
            } else {
                String::new()
            }
        };
        let body = |task: &str| {
            format!(
                "{{\"task\":\"{task}\",\"steps\":[],\"outcome\":{{}},\"meta\":{{\"source\":\"tooltune\"}}}}"
            )
        };
        // The ids a description version really has, so that a new trajectory can find the old version.
        let d1 = tooltune_core::DescriptionId::of("read_file", "Read a file.", &json!({}));
        let d2 = tooltune_core::DescriptionId::of("calculator", "Add.", &json!({}));
        let (d1, d2) = (d1.as_str(), d2.as_str());
        pool.execute(
            format!(
                "INSERT INTO descriptions VALUES ('{d1}', 'read_file', 'Read a file.', '{{}}', '2026-01-01T00:00:00Z'), \
                     ('{d2}', 'calculator', 'Add.', '{{}}', '2026-01-01T00:00:00Z'); \
                 INSERT INTO trajectories (id, source, task, ingested_at, body{seq_column}) VALUES \
                     ('t1', 'tooltune', 'Sum', '2026-01-01T00:00:00Z', '{}'{}), \
                     ('t2', 'tooltune', 'Add', '2026-01-02T00:00:00Z', '{}'{}); \
                 INSERT INTO trajectory_tools VALUES (1, 0, '{d1}', 'read_file', 1), (1, 1, '{d2}', 'calculator', 0), \
                     (2, 0, '{d2}', 'calculator', 2);",
                body("Sum"),
                seq_value(1),
                body("Add"),
                seq_value(2)
            )
            .as_str(),
        )
        .await
        .expect("old rows");
        pool.close().await;
    }
    let s = Store::open(url).await.expect("open migrates");
    let t1 = s
        .trajectory(&tooltune_core::TrajectoryId::from_stored("t1".into()))
        .await
        .expect("load")
        .expect("present");
    let names: Vec<_> = t1.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["read_file", "calculator"]);
    let stats = s.tool_stats(Some("calculator")).await.expect("stats");
    assert_eq!((stats[0].shown, stats[0].chosen, stats[0].calls), (2, 1, 2));
    let newest = s.trajectory_ids(None, 10).await.expect("ids");
    assert_eq!(
        newest.iter().map(|i| i.as_str()).collect::<Vec<_>>(),
        ["t2", "t1"]
    );
    // A new trajectory showing a known description version reuses its key, and comes first among the newest.
    let fresh = a_new_copy_reads_back(&s, &t1).await;
    let by_tool = s
        .trajectory_ids(Some("read_file"), 10)
        .await
        .expect("ids by tool");
    assert_eq!(
        by_tool,
        [
            fresh.id(),
            tooltune_core::TrajectoryId::from_stored("t1".into())
        ]
    );
    let stats = s.tool_stats(Some("read_file")).await.expect("stats");
    assert_eq!(stats.len(), 2, "a total row and one version: {stats:?}");
    assert_eq!(stats[0].shown, 2);
    s.close().await;
}

#[tokio::test]
async fn sqlite_store_from_before_0006_keeps_its_tool_lists() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("old.db").display());
    store_from_before_0006_keeps_its_tool_lists(&url, "sqlite").await;
}

#[tokio::test]
async fn postgres_store_from_before_0006_keeps_its_tool_lists() {
    let (admin, name, url) = new_pg_database().await;
    store_from_before_0006_keeps_its_tool_lists(&url, "postgres").await;
    let _ = drop_pg_database(&admin, &name).await;
}

/// A SQLite store trains one body dictionary, from the first import that brings enough records and inside that
/// import's transaction; later imports and inserts compress with it, and a new handle, which has no dictionary
/// cached, reads every body back as it was.
#[tokio::test]
async fn sqlite_bodies_compress_with_one_dictionary_trained_by_the_first_large_import() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = dir.path().join("t.sqlite").display().to_string();
    let many = |prefix: &str, n: usize| -> Vec<Trajectory> {
        (0..n)
            .map(|i| {
                let task = format!(
                    "{prefix} {i}: the refund policy for order {}",
                    i * 7919 % 1013
                );
                trajectory(&task, &["search_docs"], i % 3 > 0, "Search the docs.")
            })
            .collect()
    };
    let s = Store::open(&url).await.expect("open");
    // Chunks of 256 records: the dictionary is trained on a file's first chunk while its second one is parsed,
    // and that chunk's bodies are compressed once the dictionary is there.
    let import = |ts: String| {
        let opts = ReadOptions {
            chunk_records: 256,
            ..ReadOptions::default()
        };
        s.import(
            reader_with(ts, opts),
            "t.jsonl",
            ImportOptions::default(),
            |_| {},
        )
    };
    // Too few records to train on: stored with LZ4.
    let small = many("small", 10);
    assert_eq!(import(jsonl(&small)).await.expect("small").added, 10);
    // A rejected file keeps nothing, its dictionary included (the invalid record is in the chunk parsed while the
    // dictionary was trained).
    let mut rejected = jsonl(&many("rejected", 300));
    rejected.push_str("\n{\"task\": 5}");
    import(rejected).await.expect_err("rejected");
    // The first large import trains the dictionary; the next one and a single insert reuse it.
    let first = many("first", 300);
    let second = many("second", 300);
    assert_eq!(import(jsonl(&first)).await.expect("first").added, 300);
    assert_eq!(import(jsonl(&second)).await.expect("second").added, 300);
    let one = many("one", 1);
    assert_eq!(s.insert(&one).await.expect("insert"), 1);
    s.close().await;

    let s = Store::open(&url).await.expect("reopen");
    for t in [&small, &first, &second, &one].into_iter().flatten() {
        assert_reads_back(&s, t).await;
    }
    s.close().await;
    let pool = sqlx::any::AnyPoolOptions::new()
        .max_connections(1)
        .connect(&format!("sqlite://{url}"))
        .await
        .expect("connect");
    let dictionaries: Vec<(i64, i64)> =
        sqlx::query_as("SELECT key, samples FROM body_dictionaries")
            .fetch_all(&pool)
            .await
            .expect("dictionaries");
    assert_eq!(dictionaries, [(1, 256)]);
    let markers: Vec<(String, i64)> = sqlx::query_as(
        "SELECT CAST(substr(CAST(body AS BLOB), 2, 3) AS TEXT) AS m, COUNT(*) FROM trajectories \
         GROUP BY m ORDER BY m",
    )
    .fetch_all(&pool)
    .await
    .expect("markers");
    assert_eq!(markers, [("lz4".to_string(), 10), ("zsd".to_string(), 601)]);
    assert_no_dangling_references(&pool).await;
    pool.close().await;
}

/// An import writes with foreign keys unchecked (it references only rows it has just written or read back):
/// SQLite's own check must find every reference whole afterwards.
async fn assert_no_dangling_references(pool: &sqlx::AnyPool) {
    let dangling = sqlx::query("PRAGMA foreign_key_check")
        .fetch_all(pool)
        .await
        .expect("foreign key check");
    assert!(
        dangling.is_empty(),
        "{} dangling references",
        dangling.len()
    );
}

/// A SQLite import writes its rows through SQLite's C API, `Store::insert` (and PostgreSQL) through sqlx: the
/// same trajectories must come out as the same rows either way.
#[tokio::test]
async fn sqlite_import_writes_the_rows_insert_writes() {
    let mut ts = sample();
    let mut linked = trajectory("a rollout", &["web_search"], true, "Search internal docs.");
    linked.outcome.score = Some(0.75);
    linked.outcome.success = None;
    linked.meta.model = Some("qwen2.5-1.5b".into());
    linked.meta.client = Some("tooltune-evaluator".into());
    linked.meta.external_id = Some("ext-7".into());
    linked.meta.started_at = Some("2026-12-02T07:00:00.000Z".into());
    linked.links.run_id = Some("run-1".into());
    linked.links.candidate_id = Some("cand-2".into());
    linked.links.rollout = Some(3);
    ts.push(linked);
    let mut file = ts.clone();
    // A record twice in one file is stored once, with one tool list.
    file.push(ts[0].clone());

    let (a, b) = (sqlite().await, sqlite().await);
    let report = a.import(&file).await.expect("import");
    assert_eq!((report.added, report.already_present), (6, 1));
    assert_eq!(b.store.insert(&ts).await.expect("insert"), 6);

    async fn rows(db: &TestDb) -> Vec<String> {
        let pool = db.sqlite_pool().await;
        let rows: Vec<String> = sqlx::query_scalar(
            "SELECT json_array(t.id, t.source, t.score, t.success, t.model, t.client, t.external_id, \
             t.started_at, t.run_id, t.candidate_id, t.rollout, tt.position, d.id, d.tool, d.description, \
             d.input_schema, tt.calls) \
             FROM trajectories t LEFT JOIN trajectory_tools tt ON tt.trajectory_seq = t.seq \
             LEFT JOIN descriptions d ON d.key = tt.description_key ORDER BY t.id, tt.position",
        )
        .fetch_all(&pool)
        .await
        .expect("rows");
        pool.close().await;
        rows
    }
    let (from_import, from_insert) = (rows(&a).await, rows(&b).await);
    let pool = a.sqlite_pool().await;
    assert_no_dangling_references(&pool).await;
    pool.close().await;
    assert_eq!(from_import.len(), 6 * 2, "two tools each");
    assert_eq!(from_import, from_insert);
    for t in &ts {
        assert_reads_back(&a.store, t).await;
    }
    a.finish().await;
    b.finish().await;
}

/// A statement SQLite refuses mid-import (here a trigger that rolls the whole transaction back, as a full disk
/// would) fails the import with SQLite's reason and leaves the store as it was.
#[tokio::test]
async fn sqlite_import_refused_by_the_database_keeps_nothing_and_says_why() {
    let db = sqlite().await;
    let pool = db.sqlite_pool().await;
    sqlx::query(
        "CREATE TRIGGER refuse BEFORE INSERT ON trajectories WHEN NEW.source = 'refused' \
         BEGIN SELECT RAISE(ROLLBACK, 'refused by the test trigger'); END",
    )
    .execute(&pool)
    .await
    .expect("trigger");
    pool.close().await;

    let mut ts = sample();
    ts[2].meta.source = "refused".into();
    let e = db
        .import(&ts)
        .await
        .expect_err("the trigger refuses the third record");
    assert!(e.to_string().contains("refused by the test trigger"), "{e}");
    assert_eq!(db.store.count_trajectories().await.expect("count"), 0);
    assert_eq!(db.store.count_descriptions().await.expect("count"), 0);
    db.finish().await;
}

/// The result cache: a result reads back as stored, the first result stored under a key is the one kept, counts
/// go by kind, and a batched lookup of more keys than one query binds finds exactly the present ones.
async fn result_cache_keeps_the_first_result_and_looks_up_in_batches(db: TestDb) {
    use tooltune_store::CachedResult;
    let s = &db.store;
    assert_eq!(s.cached_result("rollout-a").await.expect("lookup"), None);
    assert_eq!(s.count_cached(None).await.expect("count"), 0);
    // No run and no trajectory of that id exist: a cache entry refers to neither.
    s.cache_result("rollout-a", "rollout", r#"{"score":1}"#, Some("traj-1"))
        .await
        .expect("cache");
    let first = CachedResult {
        kind: "rollout".into(),
        result: r#"{"score":1}"#.into(),
        trajectory_id: Some("traj-1".into()),
    };
    assert_eq!(
        s.cached_result("rollout-a").await.expect("lookup"),
        Some(first.clone())
    );
    // A second write under the same key changes nothing, whatever it carries.
    s.cache_result("rollout-a", "screen", r#"{"score":0}"#, None)
        .await
        .expect("cache again");
    assert_eq!(
        s.cached_result("rollout-a").await.expect("lookup"),
        Some(first.clone())
    );
    s.cache_result("screen-b", "screen", "0.5", None)
        .await
        .expect("cache");
    assert_eq!(s.count_cached(None).await.expect("count"), 2);
    assert_eq!(s.count_cached(Some("rollout")).await.expect("count"), 1);
    assert_eq!(s.count_cached(Some("screen")).await.expect("count"), 1);
    assert_eq!(s.count_cached(Some("other")).await.expect("count"), 0);

    // 700 more present keys among 1,300 asked for (three chunks of at most 500), some asked for twice.
    for i in 0..700 {
        s.cache_result(
            &format!("rollout-{i:04}"),
            "rollout",
            &format!("{{\"i\":{i}}}"),
            (i % 2 == 0).then(|| format!("traj-{i}")).as_deref(),
        )
        .await
        .expect("cache");
    }
    assert_eq!(s.count_cached(Some("rollout")).await.expect("count"), 701);
    let mut keys: Vec<String> = (0..1200).map(|i| format!("rollout-{i:04}")).collect();
    keys.push("rollout-a".into());
    keys.push("screen-b".into());
    keys.push("rollout-0007".into());
    keys.extend((0..97).map(|i| format!("absent-{i}")));
    assert_eq!(keys.len(), 1300);
    let found = s.cached_results(&keys).await.expect("batch lookup");
    assert_eq!(found.len(), 702);
    assert!((0..700).all(|i| found.contains_key(&format!("rollout-{i:04}"))));
    assert!(!found.keys().any(|k| k.starts_with("absent-")));
    assert!(!found.contains_key("rollout-0700"));
    assert_eq!(found["rollout-a"], first);
    assert_eq!(found["screen-b"].result, "0.5");
    assert_eq!(
        found["rollout-0042"],
        CachedResult {
            kind: "rollout".into(),
            result: r#"{"i":42}"#.into(),
            trajectory_id: Some("traj-42".into()),
        }
    );
    assert_eq!(found["rollout-0043"].trajectory_id, None);
    assert!(s.cached_results(&[]).await.expect("empty").is_empty());
    let none = s
        .cached_results(&["absent-x".to_string()])
        .await
        .expect("lookup");
    assert!(none.is_empty());
    db.finish().await;
}

#[tokio::test]
async fn sqlite_result_cache_keeps_the_first_result_and_looks_up_in_batches() {
    result_cache_keeps_the_first_result_and_looks_up_in_batches(sqlite().await).await;
}
#[tokio::test]
async fn postgres_result_cache_keeps_the_first_result_and_looks_up_in_batches() {
    result_cache_keeps_the_first_result_and_looks_up_in_batches(postgres().await).await;
}

/// Migration 0009 adds the result cache to a store written before it, whose runs and rollouts stay as they were;
/// what is cached survives closing and reopening the store.
async fn store_from_before_0009_gains_a_lasting_result_cache(url: &str, dialect: &str) {
    use sqlx::Executor;
    {
        let pool = migrated_before(url, dialect, "0009").await;
        pool.execute(
            "INSERT INTO runs (id, kind, suite, objective, config, status, state, elapsed_ms, result, error, \
                 created_at, updated_at) VALUES ('run-old', 'optimize', NULL, 'success', '{}', 'finished', NULL, 0, \
                 NULL, NULL, '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z'); \
             INSERT INTO run_rollouts VALUES ('run-old', 'cand', 'task-1', 0, '{\"score\":1}', NULL, \
                 '2026-01-01T00:00:00Z');",
        )
        .await
        .expect("old rows");
        pool.close().await;
    }
    let s = Store::open(url).await.expect("open migrates");
    assert_eq!(s.count_rollouts("run-old").await.expect("count"), 1);
    assert_eq!(s.count_cached(None).await.expect("count"), 0);
    s.cache_result("rollout-x", "rollout", r#"{"score":1}"#, Some("t1"))
        .await
        .expect("cache");
    s.close().await;

    let s = Store::open(url).await.expect("reopen");
    let back = s
        .cached_result("rollout-x")
        .await
        .expect("lookup")
        .expect("kept across reopening");
    assert_eq!(
        (
            back.kind.as_str(),
            back.result.as_str(),
            back.trajectory_id.as_deref()
        ),
        ("rollout", r#"{"score":1}"#, Some("t1"))
    );
    assert_eq!(s.count_cached(Some("rollout")).await.expect("count"), 1);
    assert_eq!(
        s.rollouts("run-old", "cand").await.expect("rollouts").len(),
        1
    );
    s.close().await;
}

#[tokio::test]
async fn sqlite_store_from_before_0009_gains_a_lasting_result_cache() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("old.db").display());
    store_from_before_0009_gains_a_lasting_result_cache(&url, "sqlite").await;
}

#[tokio::test]
async fn postgres_store_from_before_0009_gains_a_lasting_result_cache() {
    let (admin, name, url) = new_pg_database().await;
    store_from_before_0009_gains_a_lasting_result_cache(&url, "postgres").await;
    let _ = drop_pg_database(&admin, &name).await;
}

/// Labels (migration 0010) live beside the producers' outcomes: storing them changes no trajectory (content, id,
/// outcome), labelling again with the same source and model replaces the label, and the figures use a label only
/// where the producer wrote no outcome (a judge's before the heuristics'), saying which source each verdict came
/// from; ignoring labels gives the producers' figures.
async fn labels_are_kept_apart_and_used_only_where_no_outcome_was_written(db: TestDb) {
    use tooltune_store::{LabelSource, LabelUse, NewLabel};
    let s = &db.store;
    let mut ts = sample();
    // Two more runs that called search_docs, whose producer wrote no outcome.
    for task in ["no outcome one", "no outcome two"] {
        let mut t = trajectory(task, &["search_docs"], true, "Search internal docs.");
        t.outcome = Default::default();
        ts.push(t);
    }
    db.import(&ts).await.expect("import");
    let (one, two) = (ts[5].id(), ts[6].id());
    let before = s.trajectory(&one).await.expect("load").expect("present");

    // Only the two without an outcome are offered for labelling, newest first; with outcomes, all seven.
    let to_label = s
        .trajectories_to_label(Some("search_docs"), None, false, 100)
        .await
        .expect("list");
    assert_eq!(
        to_label.iter().map(|c| c.id.clone()).collect::<Vec<_>>(),
        vec![two.clone(), one.clone()]
    );
    assert!(to_label.iter().all(|c| c.producer_success.is_none()));
    let all = s
        .trajectories_to_label(None, None, true, 100)
        .await
        .expect("list");
    assert_eq!(all.len(), 7);
    assert_eq!(
        all.iter()
            .filter(|c| c.producer_success == Some(true))
            .count(),
        2
    );

    let label =
        |id: &tooltune_core::TrajectoryId, source, model: &str, success, feedback: &str| NewLabel {
            trajectory_id: id.to_string(),
            source,
            model: model.to_string(),
            score: Some(if success { 1.0 } else { 0.0 }),
            success,
            feedback: feedback.to_string(),
            detail: Some("{\"version\":\"test\"}".to_string()),
        };
    s.save_labels(&[
        label(&one, LabelSource::Heuristic, "", false, "tool_error: boom"),
        label(
            &two,
            LabelSource::Heuristic,
            "",
            true,
            "no failure evidence",
        ),
    ])
    .await
    .expect("save");
    // Again, differently: replaced, not added.
    s.save_labels(&[label(
        &one,
        LabelSource::Heuristic,
        "",
        false,
        "repeated_call: twice",
    )])
    .await
    .expect("save again");
    assert_eq!(s.count_labels(None).await.expect("count"), 2);
    let ls = s.labels(&one).await.expect("labels");
    assert_eq!(ls.len(), 1);
    assert_eq!(ls[0].label.feedback, "repeated_call: twice");
    assert_eq!(
        ls[0].label.detail.as_deref(),
        Some("{\"version\":\"test\"}")
    );

    // The trajectory is untouched: same body, same id, no outcome.
    let after = s.trajectory(&one).await.expect("load").expect("present");
    assert_eq!(after, before);
    assert_eq!(after.id(), one);
    assert_eq!(after.outcome, Default::default());

    let docs = |stats: &[tooltune_store::ToolStats]| {
        stats
            .iter()
            .find(|r| r.tool == "search_docs" && r.description_id.is_none())
            .expect("total row")
            .clone()
    };
    // Producer only: 1 of 2, as before the labels.
    let ignored = docs(
        &s.tool_stats_with(Some("search_docs"), LabelUse::Ignore)
            .await
            .expect("stats"),
    );
    assert_eq!(
        (
            ignored.success_when_chosen.hits,
            ignored.success_when_chosen.trials
        ),
        (1, 2)
    );
    assert_eq!(ignored.verdicts.heuristic.judged, 0);
    assert_eq!(
        docs(&s.tool_stats(Some("search_docs")).await.expect("stats"))
            .success_when_chosen
            .trials,
        2
    );
    // Labels used: 2 of 4, two verdicts from the heuristics.
    let used = docs(
        &s.tool_stats_with(Some("search_docs"), LabelUse::Use)
            .await
            .expect("stats"),
    );
    assert_eq!(
        (
            used.success_when_chosen.hits,
            used.success_when_chosen.trials
        ),
        (2, 4)
    );
    assert_eq!(
        (
            used.verdicts.producer.judged,
            used.verdicts.producer.succeeded
        ),
        (2, 1)
    );
    assert_eq!(
        (
            used.verdicts.heuristic.judged,
            used.verdicts.heuristic.succeeded
        ),
        (2, 1)
    );

    // A judge's label wins over the heuristics' for the same trajectory.
    s.save_labels(&[label(
        &two,
        LabelSource::Judge,
        "fake:judge",
        false,
        "wrong answer",
    )])
    .await
    .expect("judge label");
    let used = docs(
        &s.tool_stats_with(Some("search_docs"), LabelUse::Use)
            .await
            .expect("stats"),
    );
    assert_eq!(
        (
            used.success_when_chosen.hits,
            used.success_when_chosen.trials
        ),
        (1, 4)
    );
    assert_eq!(
        (used.verdicts.judge.judged, used.verdicts.heuristic.judged),
        (1, 1)
    );
    assert_eq!(
        s.labels(&two).await.expect("labels")[0].label.source,
        LabelSource::Judge
    );

    // The failing ones for --from-traces (trajectories that showed the tool): the producer's three failures and
    // both labelled ones, each with its source.
    let (failing, counts) = s
        .failing_for_tool_with("search_docs", None, 10, LabelUse::Use)
        .await
        .expect("failing");
    let mut got: Vec<(String, Option<String>)> = failing
        .iter()
        .map(|f| (f.verdict_source.clone(), f.label_feedback.clone()))
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            (
                "heuristic".to_string(),
                Some("repeated_call: twice".to_string())
            ),
            ("judge".to_string(), Some("wrong answer".to_string())),
            ("producer".to_string(), None),
            ("producer".to_string(), None),
            ("producer".to_string(), None),
        ]
    );
    assert_eq!(
        (
            counts.total().judged,
            counts.producer.judged,
            counts.judge.judged,
            counts.heuristic.judged
        ),
        (7, 5, 1, 1)
    );
    let (failing, counts) = s
        .failing_for_tool_with("search_docs", None, 10, LabelUse::Ignore)
        .await
        .expect("failing");
    assert_eq!(failing.len(), 3);
    assert_eq!((counts.total().judged, counts.judge.judged), (5, 0));
    let (old_ids, old_judged) = s
        .failing_for_tool("search_docs", None, 10)
        .await
        .expect("failing");
    assert_eq!(
        (old_ids, old_judged),
        (failing.iter().map(|f| f.id.clone()).collect::<Vec<_>>(), 5)
    );

    // A label for a trajectory that is not stored is refused, naming it, and nothing of the batch is kept.
    let e = s
        .save_labels(&[
            label(&two, LabelSource::Heuristic, "", false, "would replace"),
            NewLabel {
                trajectory_id: "f".repeat(64),
                ..label(&two, LabelSource::Heuristic, "", true, "x")
            },
        ])
        .await
        .expect_err("unknown trajectory");
    assert!(e.to_string().contains(&"f".repeat(64)), "{e}");
    assert_eq!(
        s.labels(&two).await.expect("labels")[1].label.feedback,
        "no failure evidence"
    );
    db.finish().await;
}

#[tokio::test]
async fn sqlite_labels_are_kept_apart_and_used_only_where_no_outcome_was_written() {
    labels_are_kept_apart_and_used_only_where_no_outcome_was_written(sqlite().await).await;
}
#[tokio::test]
async fn postgres_labels_are_kept_apart_and_used_only_where_no_outcome_was_written() {
    labels_are_kept_apart_and_used_only_where_no_outcome_was_written(postgres().await).await;
}

/// Two imports at once (two `POST /api/traces`, say) whose files bring the same new description versions in
/// opposite orders: each transaction holds the unique-index entry of the first version it inserted and waits for
/// the other's, which PostgreSQL breaks by aborting one of them ("deadlock detected"); the server answered that
/// request with a 500 in the web load check.
#[tokio::test]
async fn postgres_concurrent_imports_of_the_same_new_descriptions_in_opposite_orders_all_succeed() {
    let db = postgres().await;
    for round in 0..20 {
        let (a, b) = (format!("Docs A {round}."), format!("Docs B {round}."));
        let first = [
            trajectory(&format!("{round} one"), &["search_docs"], true, &a),
            trajectory(&format!("{round} two"), &["search_docs"], true, &b),
        ];
        let second = [
            trajectory(&format!("{round} three"), &["search_docs"], true, &b),
            trajectory(&format!("{round} four"), &["search_docs"], true, &a),
        ];
        let (x, y) = tokio::join!(db.store.insert(&first), db.store.insert(&second));
        x.unwrap_or_else(|e| panic!("round {round}, first import: {e}"));
        y.unwrap_or_else(|e| panic!("round {round}, second import: {e}"));
    }
    assert_eq!(db.store.count_trajectories().await.expect("count"), 80);
    db.finish().await;
}

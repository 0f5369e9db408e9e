//! `tooltune optimize` end to end with the real local model and the real contractor server: a few steps of the
//! GEPA loop, `kill -9` in the middle, `--resume`, and the result compared with a run that was never interrupted.
//! Then `tooltune report` on both stored runs, its figures checked against the store. And the same run with its
//! rollouts played by `tooltune worker` processes on PostgreSQL, through Ctrl-C, a resume, a worker's network gone
//! silent and then cut, and another worker's SIGKILL.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::ok_json as json;
use crate::postgres::{Relay, drop_postgres, fresh_postgres};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cli has a parent")
        .to_path_buf()
}

/// The folder of the tooltune binary under test; the example servers are built beside it, where suites look.
fn bin_dir() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_tooltune"));
    let dir = exe.parent().expect("bin dir").to_path_buf();
    let mut cmd = Command::new(env!("CARGO"));
    cmd.current_dir(workspace())
        .args(["build", "-q", "-p", "contractor", "-p", "week01-tools"]);
    if dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    assert!(
        cmd.status().expect("cargo").success(),
        "building the servers"
    );
    dir
}

fn optimize(db: &str, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tooltune"));
    c.arg("--database-url")
        .arg(db)
        .arg("optimize")
        .args(args)
        .env("TOOLTUNE_BIN_DIR", bin_dir())
        .env_remove("TOOLTUNE_DATABASE_URL");
    c
}

/// A count from the database, 0 while the file or its tables do not exist yet (the run creates them).
async fn query_i64(db: &str, sql: &str) -> i64 {
    use sqlx::Connection;
    let Ok(mut c) = sqlx::SqliteConnection::connect(&format!("sqlite://{db}?mode=ro")).await else {
        return 0;
    };
    sqlx::query_scalar(sql).fetch_one(&mut c).await.unwrap_or(0)
}

async fn query_strings(db: &str, sql: &str) -> Vec<String> {
    use sqlx::Connection;
    let mut c = sqlx::SqliteConnection::connect(&format!("sqlite://{db}"))
        .await
        .expect("open");
    sqlx::query_scalar(sql)
        .fetch_all(&mut c)
        .await
        .expect("query")
}

const ARGS: &[&str] = &[
    "--suite",
    "../datasets/suites/contractor-small.toml",
    "--objective",
    "success",
    "--model",
    "local:fast",
    // The 0.5B reflects too: this test is about the mechanics (a screened search, kill, resume), and the 1.5B
    // reflector tripled its time.
    "--reflector",
    "local:fast",
    "--proposals",
    "2",
    "--budget",
    "10",
    // One of the two held-out tasks rolled out, the other screened: the sampled held-out comparison end to end.
    "--test-sample",
    "1",
    "--seed",
    "7",
    "--json",
];

/// ARGS with the suite's path made absolute.
fn args() -> Vec<String> {
    ARGS.iter()
        .map(|a| match a.strip_prefix("../") {
            Some(rest) => workspace().join(rest).display().to_string(),
            None => a.to_string(),
        })
        .collect()
}

/// The reference: a run of ARGS in one process, never interrupted (its store and its JSON). Made once and shared
/// by the tests of this file, in cargo's scratch folder for integration tests.
fn reference() -> &'static (String, Value) {
    static REFERENCE: std::sync::OnceLock<(String, Value)> = std::sync::OnceLock::new();
    REFERENCE.get_or_init(|| {
        let db = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("optimize-reference-{}.sqlite", std::process::id()));
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
        }
        let db = db.display().to_string();
        let args = args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let a = json(&optimize(&db, &args).output().expect("reference run"));
        (db, a)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optimize_resumes_after_kill_and_matches_an_uninterrupted_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let suite_args = args();
    let args: Vec<&str> = suite_args.iter().map(String::as_str).collect();

    // The reference: a run that is never interrupted.
    let (db_a, a) = reference();
    let (db_a, a) = (db_a.as_str(), a.clone());

    // The same run, killed with SIGKILL once a few rollouts are stored, then resumed.
    let db_b = dir.path().join("b.sqlite").display().to_string();
    let mut child = optimize(&db_b, &args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run b");
    let started = Instant::now();
    loop {
        let n = query_i64(&db_b, "SELECT COUNT(*) FROM run_rollouts").await;
        if n >= 4 {
            break;
        }
        assert!(
            child.try_wait().expect("wait").is_none(),
            "run b ended before it could be killed"
        );
        assert!(started.elapsed() < Duration::from_secs(900), "no progress");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    let before: Vec<String> = query_strings(
        &db_b,
        "SELECT candidate_key || '/' || task_id || '/' || result FROM run_rollouts ORDER BY 1",
    )
    .await;
    let run_id = query_strings(&db_b, "SELECT id FROM runs").await.remove(0);
    let b = json(
        &optimize(&db_b, &["--resume", &run_id, "--json"])
            .output()
            .expect("resume"),
    );

    // Nothing finished before the kill was redone or lost: every stored result is still there, unchanged, and each
    // (candidate, task, rollout) has exactly one trajectory.
    let after: Vec<String> = query_strings(
        &db_b,
        "SELECT candidate_key || '/' || task_id || '/' || result FROM run_rollouts ORDER BY 1",
    )
    .await;
    for row in &before {
        assert!(after.contains(row), "lost or changed after resume: {row}");
    }
    let duplicates = query_i64(
        &db_b,
        "SELECT COUNT(*) FROM (SELECT candidate_id, external_id, rollout FROM trajectories \
         GROUP BY candidate_id, external_id, rollout HAVING COUNT(*) > 1)",
    )
    .await;
    assert_eq!(duplicates, 0, "a finished rollout was run again");

    // The resumed run ends where the uninterrupted one did.
    for key in ["winner", "winner_descriptions", "rollouts", "stop_reason"] {
        assert_eq!(a[key], b[key], "{key} differs after resume");
    }
    assert_eq!(a["test"]["winner"], b["test"]["winner"]);
    // It was a screened search: proposals were screened before any rollout of theirs, and the counts survive the
    // resume.
    for key in ["screened", "proposals", "screened_out"] {
        assert_eq!(a[key], b[key], "{key} differs after resume");
    }
    assert!(
        b["screened"].as_u64().unwrap_or(0) > 0,
        "no screened evaluation: {}",
        b["screened"]
    );
    // Both objectives are reported, whichever was optimised: success and the played rates from the rolled-out
    // task, the exact first-move figures (off-target selection included) from both.
    for side in ["seed", "winner"] {
        let t = &b["test"][side];
        for metric in ["success", "selection"] {
            assert_eq!(
                t[metric]["trials"].as_u64(),
                Some(1),
                "test.{side}.{metric}: {t}"
            );
        }
        assert_eq!(
            (t["tasks"].as_u64(), t["rollouts"].as_u64()),
            (Some(2), Some(1)),
            "{t}"
        );
        assert!(
            t["expected"]["off_target"].as_f64().is_some(),
            "test.{side}: {t}"
        );
        assert!(t["expected_routing"].as_f64().is_some(), "test.{side}: {t}");
    }
    assert!(b["test"]["success_p_value"].as_f64().is_some());
    assert!(b["candidates"].as_array().is_some_and(|c| !c.is_empty()));

    // The report of each stored run shows what the store holds.
    let run_a = query_strings(db_a, "SELECT id FROM runs").await.remove(0);
    check_report(db_a, &run_a, &dir.path().join("report-a")).await;
    check_report(&db_b, &run_id, &dir.path().join("report-b")).await;
    // TOOLTUNE_KEEP_TEST_DB=DIR keeps both stores and reports, to look at them after the test.
    if let Some(keep) = std::env::var_os("TOOLTUNE_KEEP_TEST_DB") {
        let keep = PathBuf::from(keep);
        std::fs::create_dir_all(&keep).expect("keep dir");
        for entry in std::fs::read_dir(dir.path()).expect("tempdir") {
            let path = entry.expect("entry").path();
            let to = keep.join(path.file_name().expect("name"));
            if path.is_dir() {
                std::fs::create_dir_all(&to).expect("dir");
                for f in std::fs::read_dir(&path).expect("report dir") {
                    let f = f.expect("entry").path();
                    std::fs::copy(&f, to.join(f.file_name().expect("name"))).expect("copy");
                }
            } else {
                std::fs::copy(&path, &to).expect("copy");
            }
        }
    }
}

/// Runs `tooltune report RUN --out DIR --json` and checks its figures against the store: rollouts, winner, the
/// test split's rates and p-values, one chart point per validation evaluation, and the page itself.
async fn check_report(db: &str, run_id: &str, out: &Path) {
    let o = Command::new(env!("CARGO_BIN_EXE_tooltune"))
        .arg("--database-url")
        .arg(db)
        .args(["report", run_id, "--json", "--out"])
        .arg(out)
        .env_remove("TOOLTUNE_DATABASE_URL")
        .output()
        .expect("report");
    let report = json(&o);
    let r = &report["runs"][0];
    let store = tooltune_store::Store::open(db).await.expect("store");
    let row = store.run(run_id).await.expect("run").expect("stored run");
    let summary: Value =
        serde_json::from_str(row.result.as_deref().expect("finished run")).expect("summary");
    assert_eq!(r["run_id"], run_id);
    assert_eq!(r["finished"], true);
    assert_eq!(r["rollouts"], summary["rollouts"]);
    assert_eq!(r["winner"], summary["winner"]);
    for side in ["seed", "winner"] {
        for metric in ["success", "selection", "off_target"] {
            assert_eq!(
                r["test"][side][metric], summary["test"][side][metric],
                "test.{side}.{metric}"
            );
        }
    }
    for p in ["success_p_value", "selection_p_value", "objective_p_value"] {
        assert_eq!(r["test"][p], summary["test"][p], "{p}");
    }
    // One chart point per validation evaluation, in order; a resumed run repeats the evaluation that was in
    // flight (same candidate, same rollout count), and the report shows that one once.
    let mut validation: Vec<(u64, u64)> = Vec::new();
    let mut raw = 0;
    for (_, e) in store.events(run_id, -1).await.expect("events") {
        let e: Value = serde_json::from_str(&e).expect("event");
        if e["event"] == "evaluated" && e["phase"] == "validation" {
            raw += 1;
            let key = (
                e["candidate"].as_u64().expect("candidate"),
                e["rollouts_spent"].as_u64().expect("rollouts"),
            );
            if validation.last() != Some(&key) {
                validation.push(key);
            }
        }
    }
    let series = r["series"].as_array().expect("series");
    let points: Vec<(u64, u64)> = series
        .iter()
        .map(|p| {
            (
                p["candidate"].as_u64().expect("candidate"),
                p["rollouts_spent"].as_u64().expect("rollouts"),
            )
        })
        .collect();
    assert_eq!(points, validation);
    assert!(!series.is_empty() && series.len() <= raw);
    let resumed = store
        .events(run_id, -1)
        .await
        .expect("events")
        .iter()
        .any(|(_, e)| e.contains("\"resumed\":true"));
    if !resumed {
        assert_eq!(
            series.len(),
            raw,
            "an uninterrupted run has no repeated evaluation"
        );
    }
    for p in series {
        assert!(
            p["success"]["trials"].as_u64().is_some_and(|n| n > 0),
            "{p}"
        );
        assert!(
            p["selection"]["trials"].as_u64().is_some_and(|n| n > 0),
            "{p}"
        );
    }

    // The files: the JSON printed is the JSON written, and the page shows every lineage description escaped.
    let written: Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("report.json")).expect("report.json"),
    )
    .expect("JSON");
    assert_eq!(written, report);
    let html = std::fs::read_to_string(out.join("report.html")).expect("report.html");
    assert!(html.contains("<svg") && html.contains("</svg>"));
    assert!(!html.contains("<script"));
    let mut plain = String::new();
    let mut rest = html.as_str();
    while let Some(i) = rest.find("<mark") {
        plain.push_str(&rest[..i]);
        let after = &rest[i..];
        rest = &after[after.find('>').map_or(after.len(), |j| j + 1)..];
    }
    plain.push_str(rest);
    let plain = plain.replace("</mark>", "");
    for step in summary["lineage"].as_array().expect("lineage") {
        let d = step["description"].as_str().expect("description");
        assert!(
            plain.contains(&tooltune_report::escape_html(d)),
            "description of c{} missing from the page: {d}",
            step["candidate"]
        );
    }
}

async fn pg_i64(url: &str, sql: &str) -> i64 {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(url).await.expect("connect");
    sqlx::query_scalar(sql).fetch_one(&mut c).await.expect(sql)
}

/// A `tooltune worker` on `db` printing its events as JSON lines; short visibility timeout, so a killed worker's
/// jobs come back within seconds.
fn worker(db: &str) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_tooltune"))
        .arg("--database-url")
        .arg(db)
        // The driver's thread count (the default): with another, a worker's greedy output could differ from the
        // driver's, so it would serve another queue.
        .args([
            "worker",
            "--model",
            "local:fast",
            "--visibility-timeout",
            "5",
            // What notices the frozen network of worker 2; generous against two contended cores.
            "--store-timeout",
            "3",
            "--json",
        ])
        .arg("--suite-dir")
        .arg(workspace().join("datasets/suites"))
        .env("TOOLTUNE_BIN_DIR", bin_dir())
        .env_remove("TOOLTUNE_DATABASE_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start a worker")
}

/// One run on workers through every fault the queue is for, in turn (one run, not one per fault: each costs a
/// whole search on two cores). Ctrl-C while no worker takes the jobs; a resume once workers come, which sends
/// none of the queued jobs again; a worker's network gone silent while it holds jobs (noticed by the worker's own
/// time limit), then cut, then restored; another worker killed
/// with SIGKILL as it takes its first jobs. The run ends as the run in one process did, with every rollout stored
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optimize_on_workers_through_ctrl_c_resume_a_silent_network_a_cut_and_a_kill_matches_a_single_process_run()
 {
    // Where the test's time goes, printed with `--nocapture` (it is the longest of the suite).
    let t0 = Instant::now();
    let phase = |what: &str| eprintln!("[{:6.1} s] {what}", t0.elapsed().as_secs_f64());
    let (a_db, a) = reference();
    let _ = a_db;
    phase("the single-process reference is ready");
    let (db, admin, name) = fresh_postgres().await;

    // Ctrl-C while no worker takes the jobs: the driver waits for workers; once it has sent its first jobs,
    // SIGINT.
    let mut args = args();
    args.push("--workers".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut first = optimize(&db, &args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run on workers");
    let started = Instant::now();
    let queued = loop {
        if let Some(q) = job_queue(&db).await {
            let n = pg_i64(&db, &format!("SELECT COUNT(*) FROM pgmq.q_{q}")).await;
            if n > 0 {
                break n;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the driver sent no jobs"
        );
        assert!(first.try_wait().expect("poll").is_none(), "the run ended");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    phase("the driver queued its first jobs; Ctrl-C");
    let status = Command::new("kill")
        .args(["-INT", &first.id().to_string()])
        .status()
        .expect("kill -INT");
    assert!(status.success());
    let asked = Instant::now();
    let out = loop {
        if first.try_wait().expect("poll").is_some() {
            break first.wait_with_output().expect("output");
        }
        assert!(
            asked.elapsed() < Duration::from_secs(20),
            "the run still waits for workers 20 s after Ctrl-C"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    let run_id = query_run_id(&db).await;
    assert!(
        stderr.contains(&format!("tooltune optimize --resume {run_id}")),
        "{stderr}"
    );
    let (status, error) = {
        use sqlx::Connection;
        let mut c = sqlx::PgConnection::connect(&db).await.expect("connect");
        sqlx::query_as::<_, (String, Option<String>)>("SELECT status, error FROM runs")
            .fetch_one(&mut c)
            .await
            .expect("the run's row")
    };
    assert_eq!(status, "stopped", "{error:?}");
    // Its jobs stay queued for workers that come later.
    let queue = job_queue(&db).await.expect("the run's queue");
    let left = pg_i64(&db, &format!("SELECT COUNT(*) FROM pgmq.q_{queue}")).await;
    assert_eq!(left, queued);

    // Workers come and the run is resumed. Worker 2 reaches the store through a relay the test breaks: first the
    // network goes silent (packets dropped, sockets left open), then, once the worker has noticed, the link drops
    // outright. The others connect directly.
    phase("the run stopped; resuming on workers");
    let relay = Relay::start(&db).await;
    // Their event lines come to one channel, tagged with the worker's index.
    let (tx, rx) = std::sync::mpsc::channel::<(usize, Value)>();
    let spawn = |i: usize, url: &str| {
        let mut w = worker(url);
        let out = w.stdout.take().expect("worker stdout");
        let tx = tx.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    let _ = tx.send((i, v));
                }
            }
        });
        Some(w)
    };
    // Worker 2 starts alone, so that it surely holds jobs when its network fails.
    let mut workers: Vec<Option<std::process::Child>> = vec![None, None, spawn(2, &relay.url)];
    let mut run = optimize(&db, &["--resume", &run_id, "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("resume on workers");
    // 1. Worker 2 takes jobs: its network freezes, and workers 0 and 1 start. 2. The first of them to take jobs
    // is killed with SIGKILL, before it can finish them. 3. Worker 2 notices the silent network by its own time
    // limit (no socket error comes): the link is then cut. 4. Once its jobs' visibility timeout (5 s) has passed,
    // the network comes back.
    let started = Instant::now();
    let mut cut_at: Option<Instant> = None;
    let mut killed: Option<usize> = None;
    let mut noticed = false;
    let mut restored_at: Option<Instant> = None;
    let mut seen: Vec<(usize, Value, Option<Instant>)> = Vec::new();
    while killed.is_none() || restored_at.is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "stuck: cut {cut_at:?}, killed {killed:?}, noticed {noticed}; events {seen:?}"
        );
        assert!(
            run.try_wait().expect("poll the run").is_none(),
            "the run ended before both faults: cut {cut_at:?}, killed {killed:?}, noticed {noticed}"
        );
        let Ok((i, e)) = rx.recv_timeout(Duration::from_millis(500)) else {
            if noticed
                && restored_at.is_none()
                && cut_at.is_some_and(|t| t.elapsed() > Duration::from_secs(6))
            {
                relay.restore();
                restored_at = Some(Instant::now());
                phase("worker 2's network restored");
            }
            continue;
        };
        match (i, e["event"].as_str()) {
            (2, Some("taken")) if cut_at.is_none() => {
                relay.freeze();
                cut_at = Some(Instant::now());
                phase("worker 2 took jobs; its network frozen, workers 0 and 1 start");
                workers[0] = spawn(0, &db);
                workers[1] = spawn(1, &db);
            }
            (2, Some("store_lost")) if !noticed => {
                let error = e["error"].as_str().unwrap_or_default();
                assert!(
                    error.contains("no answer from the store within"),
                    "worker 2 noticed the frozen network by something other than its time limit: {error}"
                );
                noticed = true;
                relay.cut();
                phase("worker 2 noticed the silence; its link cut");
            }
            (0 | 1, Some("taken")) if killed.is_none() => {
                let mut w = workers[i].take().expect("worker alive");
                w.kill().expect("SIGKILL");
                w.wait().expect("reaped");
                killed = Some(i);
                phase("a worker killed as it took its first jobs");
            }
            _ => {}
        }
        seen.push((i, e, restored_at));
    }
    let killed = killed.expect("a worker was killed");
    let restored_at = restored_at.expect("the network came back");
    let out = run.wait_with_output().expect("the resumed run");
    phase("the resumed run ended");
    // The cut-off worker survived the freeze and the cut: it is still running, and told of the store's return.
    let cut_off = workers[2].as_mut().expect("worker 2");
    assert!(
        cut_off.try_wait().expect("poll worker 2").is_none(),
        "the worker whose network was cut exited"
    );
    for mut w in workers.into_iter().flatten() {
        let _ = w.kill();
        let _ = w.wait();
    }
    let b = json(&out);
    let events: Vec<(usize, Value)> = seen
        .into_iter()
        .map(|(i, e, _)| (i, e))
        .chain(rx.try_iter())
        .collect();
    assert!(
        events
            .iter()
            .any(|(i, e)| *i == 2 && e["event"] == "store_back"),
        "worker 2 did not report the store back after the network returned ({:?} ago)",
        restored_at.elapsed()
    );

    // The same search as in one process.
    for key in [
        "winner",
        "winner_descriptions",
        "rollouts",
        "stop_reason",
        "screened",
        "proposals",
        "screened_out",
    ] {
        assert_eq!(a[key], b[key], "{key} differs on workers");
    }
    assert_eq!(a["test"]["winner"], b["test"]["winner"]);
    assert_eq!(a["test"]["seed"], b["test"]["seed"]);

    // The killed worker's jobs were taken again and finished by the others; every job has one result; work was
    // spread; and each (candidate, task, rollout) has one trajectory.
    let retried = pg_i64(&db, "SELECT COUNT(*) FROM job_results WHERE attempts >= 2").await;
    assert!(retried >= 1, "no job was taken again after the kill");
    let given_up = pg_i64(&db, "SELECT COUNT(*) FROM job_results WHERE infra = 1").await;
    assert_eq!(given_up, 0, "a job was given up");
    // The killed worker, killed as it took its first jobs, wrote no result: the others finished its jobs.
    let killed_id = events
        .iter()
        .find(|(i, e)| *i == killed && e["event"] == "started")
        .and_then(|(_, e)| e["worker"].as_str())
        .expect("the killed worker's id")
        .replace('\'', "''");
    let by_killed = pg_i64(
        &db,
        &format!("SELECT COUNT(*) FROM job_results WHERE worker = '{killed_id}'"),
    )
    .await;
    assert_eq!(by_killed, 0, "the killed worker wrote results");
    let duplicates = pg_i64(
        &db,
        "SELECT COUNT(*) FROM (SELECT candidate_id, external_id, rollout FROM trajectories \
         GROUP BY candidate_id, external_id, rollout HAVING COUNT(*) > 1) d",
    )
    .await;
    assert_eq!(duplicates, 0, "a rollout was stored twice");
    // Every rollout's trajectory is stored, and no other (a rollout reused under another candidate with the
    // same descriptions shares its trajectory).
    let referenced = pg_i64(
        &db,
        "SELECT COUNT(DISTINCT trajectory_id) FROM run_rollouts WHERE trajectory_id IS NOT NULL",
    )
    .await;
    let trajectories = pg_i64(&db, "SELECT COUNT(*) FROM trajectories").await;
    let missing = pg_i64(
        &db,
        "SELECT COUNT(*) FROM run_rollouts r WHERE r.trajectory_id IS NOT NULL \
         AND NOT EXISTS (SELECT 1 FROM trajectories t WHERE t.id = r.trajectory_id)",
    )
    .await;
    assert_eq!(missing, 0, "a rollout's trajectory was lost");
    assert_eq!(referenced, trajectories, "a trajectory no rollout names");
    // Nothing is left in the queue, and no job was sent twice: every message ever sent is in the queue or its
    // archive, the ones sent before Ctrl-C among them.
    let left = pg_i64(&db, &format!("SELECT COUNT(*) FROM pgmq.q_{queue}")).await;
    assert_eq!(left, 0, "jobs left in the queue");
    let sent_twice = pg_i64(
        &db,
        &format!(
            "SELECT COUNT(*) FROM (SELECT k FROM (SELECT message->>'key' AS k FROM pgmq.q_{queue} \
             UNION ALL SELECT message->>'key' FROM pgmq.a_{queue}) m GROUP BY k HAVING COUNT(*) > 1) d"
        ),
    )
    .await;
    assert_eq!(sent_twice, 0, "a job was sent again on resume");
    assert!(
        events
            .iter()
            .skip_while(|(i, e)| !(*i == killed && e["event"] == "taken"))
            .skip(1)
            .all(|(i, _)| *i != killed),
        "the killed worker reported after its kill"
    );

    drop_postgres(&admin, &name).await;
}

/// The run's job queue, once the driver has registered it.
async fn job_queue(db: &str) -> Option<String> {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(db).await.ok()?;
    sqlx::query_scalar("SELECT queue FROM job_queues")
        .fetch_optional(&mut c)
        .await
        .ok()
        .flatten()
}

async fn query_run_id(db: &str) -> String {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(db).await.expect("connect");
    sqlx::query_scalar("SELECT id FROM runs")
        .fetch_one(&mut c)
        .await
        .expect("one run")
}

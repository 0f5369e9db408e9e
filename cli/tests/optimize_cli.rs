//! `tooltune optimize` end to end with the real local model and the real contractor server: a few steps of the
//! GEPA loop, `kill -9` in the middle, `--resume`, and the result compared with a run that was never interrupted.
//! Then `tooltune report` on both stored runs, its figures checked against the store.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

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

fn json(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "tooltune failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&o.stdout)))
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optimize_resumes_after_kill_and_matches_an_uninterrupted_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let suite_args: Vec<String> = ARGS
        .iter()
        .map(|a| match a.strip_prefix("../") {
            Some(rest) => workspace().join(rest).display().to_string(),
            None => a.to_string(),
        })
        .collect();
    let args: Vec<&str> = suite_args.iter().map(String::as_str).collect();

    // The reference: a run that is never interrupted.
    let db_a = dir.path().join("a.sqlite").display().to_string();
    let a = json(&optimize(&db_a, &args).output().expect("run a"));

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
    let run_a = query_strings(&db_a, "SELECT id FROM runs").await.remove(0);
    check_report(&db_a, &run_a, &dir.path().join("report-a")).await;
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

//! The `tooltune` binary as a user meets it: `ingest` of each format, `traces stats --json`, and bad input, on a
//! SQLite file and on the PostgreSQL that `scripts/test` starts.

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use tooltune_core::Trajectory;

const FORMATS: [&str; 4] = ["tooltune", "openai", "langfuse", "otel"];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../ingest/tests/fixtures")
}

fn tooltune(db: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tooltune"))
        .arg("--database-url")
        .arg(db)
        .args(args)
        .env_remove("TOOLTUNE_DATABASE_URL")
        .output()
        .expect("run tooltune")
}

fn stdout_json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}):\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

/// (shown, chosen, calls) per tool, counted directly from the expected trajectories, independently of the store's
/// SQL.
fn expected_counts() -> (usize, BTreeMap<String, (u64, u64, u64)>) {
    let mut n = 0;
    let mut m: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    for f in FORMATS {
        let text = std::fs::read_to_string(fixtures().join(format!("{f}.expected.jsonl")))
            .expect("expected fixture");
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let t: Trajectory = serde_json::from_str(line).expect("expected trajectory");
            n += 1;
            for tool in &t.tools {
                let calls = t.calls_of(&tool.name) as u64;
                let e = m.entry(tool.name.clone()).or_default();
                e.0 += 1;
                e.1 += u64::from(calls > 0);
                e.2 += calls;
            }
        }
    }
    (n, m)
}

fn check_each_format_then_stats(db: &str) {
    for f in FORMATS {
        let path = fixtures().join(format!("{f}.jsonl"));
        let o = tooltune(
            db,
            &["ingest", "--json", path.to_str().expect("utf-8 path")],
        );
        assert!(
            o.status.success(),
            "{f}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let j = stdout_json(&o);
        assert_eq!(j["files"][0]["report"]["format"], f, "{j}");
    }
    let (n, expected) = expected_counts();
    let stats = stdout_json(&tooltune(db, &["traces", "stats", "--json"]));
    assert_eq!(stats["trajectories"], n as u64);
    let mut got: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    for row in stats["tools"].as_array().expect("tools") {
        if row["description_id"].is_null() {
            let c = |k: &str| row[k].as_u64().expect("count");
            got.insert(
                row["tool"].as_str().expect("tool").to_string(),
                (c("shown"), c("chosen"), c("calls")),
            );
            let share = &row["selection_share"];
            assert!(share["low"].as_f64() <= share["value"].as_f64());
            assert!(share["value"].as_f64() <= share["high"].as_f64());
        }
    }
    assert_eq!(got, expected);

    // The same files again add nothing.
    let all: Vec<String> = FORMATS
        .iter()
        .map(|f| fixtures().join(format!("{f}.jsonl")).display().to_string())
        .collect();
    let mut args = vec!["ingest", "--json"];
    args.extend(all.iter().map(String::as_str));
    let j = stdout_json(&tooltune(db, &args));
    for file in j["files"].as_array().expect("files") {
        assert_eq!(file["report"]["added"], 0, "{file}");
    }
    let stats = stdout_json(&tooltune(db, &["traces", "stats", "--json"]));
    assert_eq!(stats["trajectories"], n as u64);
}

fn check_malformed_file_changes_nothing(db: &str, dir: &Path) {
    let good = std::fs::read_to_string(fixtures().join("tooltune.jsonl")).expect("fixture");
    let before = stdout_json(&tooltune(db, &["traces", "stats", "--json"]));
    let bad = dir.join("bad.jsonl");
    // Two good records, then a truncated one on line 3, then a good one.
    let mut lines = good.lines().filter(|l| !l.trim().is_empty());
    let (a, b, c) = (
        lines.next().expect("line"),
        lines.next().expect("line"),
        lines.next().expect("line"),
    );
    std::fs::write(&bad, format!("{a}\n{b}\n{}\n{c}\n", &c[..c.len() / 2])).expect("write");
    let o = tooltune(db, &["ingest", bad.to_str().expect("path")]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("bad.jsonl:3"), "{err}");
    // The line is named once, as file:line, not again inside the message.
    assert!(!err.contains("line 3"), "{err}");
    assert!(err.contains("nothing of this file was stored"), "{err}");
    let after = stdout_json(&tooltune(db, &["traces", "stats", "--json"]));
    assert_eq!(before, after, "a rejected file changed the store");

    // Unknown format name.
    let o = tooltune(
        db,
        &["ingest", "--format", "xml", bad.to_str().expect("path")],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("otel") && err.contains("langfuse"), "{err}");

    // --skip-invalid stores the valid ones and lists the skipped line.
    let o = tooltune(
        db,
        &[
            "ingest",
            "--skip-invalid",
            "--json",
            bad.to_str().expect("path"),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j = stdout_json(&o);
    assert_eq!(j["files"][0]["report"]["skipped"][0]["line"], 3, "{j}");
    let message = j["files"][0]["report"]["skipped"][0]["message"]
        .as_str()
        .expect("a skipped record's message");
    assert!(!message.is_empty() && !message.contains("line 3"), "{j}");
}

#[test]
fn sqlite_each_format_then_stats() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("t.sqlite").display().to_string();
    check_each_format_then_stats(&db);
    check_malformed_file_changes_nothing(&db, dir.path());
}

#[test]
fn postgres_each_format_then_stats() {
    let admin = std::env::var("TOOLTUNE_TEST_POSTGRES_URL").expect(
        "TOOLTUNE_TEST_POSTGRES_URL must name a PostgreSQL server: run the tests through scripts/test",
    );
    let name = format!("tooltune_cli_{}", std::process::id());
    let psql = |sql: &str| {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        rt.block_on(async {
            use sqlx::Connection;
            let mut c = sqlx::PgConnection::connect(&admin).await.expect("connect");
            sqlx::query(sql).execute(&mut c).await.expect("admin query");
        });
    };
    psql(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
    psql(&format!("CREATE DATABASE {name}"));
    let (base, _) = admin.rsplit_once('/').expect("URL with a database");
    let db = format!("{base}/{name}");
    let dir = tempfile::tempdir().expect("tempdir");
    check_each_format_then_stats(&db);
    check_malformed_file_changes_nothing(&db, dir.path());
    psql(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
}

/// `tooltune traces stats | head -1`: when the reader closes the pipe, the command ends without a panic message.
#[test]
#[cfg(unix)]
fn stats_into_a_closed_pipe_ends_quietly() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("t.sqlite").display().to_string();
    // 2,000 tools, so that the report is far more than a pipe holds (64 KiB) and the command is still writing
    // when the pipe closes.
    let file = dir.path().join("many-tools.jsonl");
    let lines: Vec<String> = (0..50)
        .map(|i| {
            let tools: Vec<Value> = (0..40)
                .map(|j| serde_json::json!({"name": format!("tool_{i}_{j}"), "description": "A tool."}))
                .collect();
            serde_json::json!({"task": format!("task {i}"), "tools": tools}).to_string()
        })
        .collect();
    std::fs::write(&file, lines.join("\n")).expect("write");
    let o = tooltune(&db, &["ingest", &file.display().to_string()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for _ in 0..3 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tooltune"))
            .args(["--database-url", &db, "traces", "stats"])
            .env_remove("TOOLTUNE_DATABASE_URL")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run tooltune");
        // Read one line, as `head -1` does, then close the pipe while the command still has lines to write.
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut first = String::new();
        out.read_line(&mut first).expect("a first line");
        drop(out);
        let o = child.wait_with_output().expect("wait");
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

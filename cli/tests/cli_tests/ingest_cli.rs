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

/// A fixture of `ingest/tests/fixtures/shapes`: the records of a format's JSON Lines fixture, laid out otherwise.
fn shaped(name: &str) -> PathBuf {
    fixtures().join("shapes").join(name)
}

/// Ingests `file` (with `extra` arguments) into `db`: it must be read in `shape` as `format` and add `n`
/// trajectories; then the format's JSON Lines fixture must find all `n` already present, which holds only if
/// both gave the same trajectory ids.
fn check_same_as_jsonl(db: &str, file: &Path, extra: &[&str], shape: &str, format: &str, n: u64) {
    let mut args = vec!["ingest", "--json"];
    args.extend_from_slice(extra);
    args.push(file.to_str().expect("utf-8 path"));
    let o = tooltune(db, &args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j = stdout_json(&o);
    let f = &j["files"][0];
    assert_eq!(f["shape"], shape, "{j}");
    assert_eq!(f["report"]["format"], format, "{j}");
    assert_eq!(f["report"]["added"], n, "{j}");
    let jsonl = fixtures().join(format!("{format}.jsonl"));
    let j = stdout_json(&tooltune(
        db,
        &["ingest", "--json", jsonl.to_str().expect("utf-8 path")],
    ));
    assert_eq!(j["files"][0]["report"]["already_present"], n, "{j}");
}

fn fresh_db(dir: &Path, name: &str) -> String {
    dir.join(format!("{name}.sqlite")).display().to_string()
}

#[test]
fn cli_reads_a_document_of_one_record_or_several() {
    let dir = tempfile::tempdir().expect("tempdir");
    // One pretty-printed record: the first of the JSON Lines form.
    let db = fresh_db(dir.path(), "one");
    check_same_as_jsonl(
        &db,
        &shaped("tooltune.document.json"),
        &[],
        "document",
        "tooltune",
        1,
    );
    // One OTLP request holding every span.
    let db = fresh_db(dir.path(), "otel");
    check_same_as_jsonl(
        &db,
        &shaped("otel.document.json"),
        &[],
        "document",
        "otel",
        3,
    );
    // Several pretty-printed records one after another.
    let db = fresh_db(dir.path(), "pretty");
    check_same_as_jsonl(
        &db,
        &shaped("openai.pretty.json"),
        &[],
        "document",
        "openai",
        3,
    );
}

#[test]
fn cli_reads_concatenated_values() {
    let dir = tempfile::tempdir().expect("tempdir");
    for format in FORMATS {
        let db = fresh_db(dir.path(), format);
        let file = shaped(&format!("{format}.concatenated.json"));
        check_same_as_jsonl(&db, &file, &[], "document", format, 3);
    }
}

#[test]
fn cli_reads_a_top_level_array() {
    let dir = tempfile::tempdir().expect("tempdir");
    for format in FORMATS {
        let db = fresh_db(dir.path(), format);
        let file = shaped(&format!("{format}.array.json"));
        check_same_as_jsonl(&db, &file, &[], "array", format, 3);
    }
    // `--shape` and `--format` named instead of detected.
    let db = fresh_db(dir.path(), "named");
    let file = shaped("langfuse.array.json");
    check_same_as_jsonl(
        &db,
        &file,
        &["--shape", "array", "--format", "langfuse"],
        "array",
        "langfuse",
        3,
    );
}

#[test]
fn cli_reads_langfuse_pages() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = fresh_db(dir.path(), "page");
    check_same_as_jsonl(
        &db,
        &shaped("langfuse.page.json"),
        &[],
        "page",
        "langfuse",
        3,
    );
    // Two pages one after another, as a loop over `?page=N` appends them.
    let db = fresh_db(dir.path(), "pages");
    check_same_as_jsonl(
        &db,
        &shaped("langfuse.pages.json"),
        &[],
        "page",
        "langfuse",
        3,
    );
}

#[test]
fn cli_reads_gzip_and_zstd() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = fresh_db(dir.path(), "gz");
    check_same_as_jsonl(
        &db,
        &shaped("langfuse.jsonl.gz"),
        &[],
        "jsonl",
        "langfuse",
        3,
    );
    let db = fresh_db(dir.path(), "zst");
    check_same_as_jsonl(&db, &shaped("otel.array.json.zst"), &[], "array", "otel", 3);
}

#[test]
fn cli_reads_standard_input() {
    use std::io::Write;
    use std::process::Stdio;
    let dir = tempfile::tempdir().expect("tempdir");
    // A page piped in as `curl ... | tooltune ingest --format langfuse -` would, then a gzip file piped in.
    for (i, (file, shape, format)) in [
        ("langfuse.page.json", "page", "langfuse"),
        ("tooltune.array.json.gz", "array", "tooltune"),
    ]
    .into_iter()
    .enumerate()
    {
        let db = fresh_db(dir.path(), &format!("stdin{i}"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_tooltune"))
            .args([
                "--database-url",
                &db,
                "ingest",
                "--json",
                "--format",
                format,
                "-",
            ])
            .env_remove("TOOLTUNE_DATABASE_URL")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run tooltune");
        let bytes = std::fs::read(shaped(file)).expect("fixture");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(&bytes)
            .expect("write stdin");
        let o = child.wait_with_output().expect("wait");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let j = stdout_json(&o);
        assert_eq!(j["files"][0]["file"], "stdin", "{j}");
        assert_eq!(j["files"][0]["shape"], shape, "{j}");
        assert_eq!(j["files"][0]["report"]["added"], 3, "{j}");
        let jsonl = fixtures().join(format!("{format}.jsonl"));
        let j = stdout_json(&tooltune(
            &db,
            &["ingest", "--json", jsonl.to_str().expect("utf-8 path")],
        ));
        assert_eq!(j["files"][0]["report"]["already_present"], 3, "{j}");
    }
}

#[test]
fn cli_refuses_broken_shapes_naming_the_place_and_stores_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = fresh_db(dir.path(), "broken");
    let seed = fixtures().join("openai.jsonl");
    let o = tooltune(&db, &["ingest", seed.to_str().expect("utf-8 path")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let before = stdout_json(&tooltune(&db, &["traces", "stats", "--json"]));

    let array = std::fs::read_to_string(shaped("tooltune.array.json")).expect("fixture");
    let truncated = dir.path().join("truncated.json");
    std::fs::write(&truncated, &array[..array.len() - 200]).expect("write");
    let page = dir.path().join("page.json");
    std::fs::write(
        &page,
        "{\"data\": {\"id\": \"t\"}, \"meta\": {\"page\": 1}}",
    )
    .expect("write");
    let gz = std::fs::read(shaped("langfuse.jsonl.gz")).expect("fixture");
    let cut = dir.path().join("cut.jsonl.gz");
    std::fs::write(&cut, &gz[..gz.len() / 2]).expect("write");
    let empty = dir.path().join("empty.json");
    std::fs::write(&empty, "\n").expect("write");

    let path = |p: &Path| p.to_str().expect("utf-8 path").to_string();
    let cases: [(String, Vec<&str>, &str); 4] = [
        (path(&truncated), vec![], "truncated.json:"),
        (
            path(&page),
            vec![],
            "page.json:1:10: data: the page's `data` is not a list",
        ),
        (path(&cut), vec![], "cut.jsonl.gz:"),
        (
            path(&empty),
            vec!["--shape", "document"],
            "empty.json:2:1: the input holds no JSON value (an empty document",
        ),
    ];
    let details = ["[2]: the input ends inside this value", "", "gzip data", ""];
    for ((file, extra, place), detail) in cases.iter().zip(details) {
        // Refused alike with and without --skip-invalid: no record after a break in the structure can be found.
        for skip in [false, true] {
            let mut args = vec!["ingest"];
            args.extend(extra.iter().copied());
            if skip {
                args.push("--skip-invalid");
            }
            args.push(file);
            let o = tooltune(&db, &args);
            assert!(!o.status.success(), "{file} was accepted");
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(err.contains(place), "{file}: {err}");
            assert!(err.contains(detail), "{file}: {err}");
            // The file is named once, not twice over.
            assert_eq!(err.matches(file.as_str()).count(), 1, "{err}");
            let after = stdout_json(&tooltune(&db, &["traces", "stats", "--json"]));
            assert_eq!(before, after, "{file} changed the store");
        }
    }
}

#[test]
fn cli_skips_or_refuses_a_bad_record_of_an_array_as_of_a_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = fresh_db(dir.path(), "skip");
    // The pretty array fixture with its second record's first step made unreadable.
    let array = std::fs::read_to_string(shaped("tooltune.array.json")).expect("fixture");
    let mut v: Value = serde_json::from_str(&array).expect("json");
    v[1]["steps"][0]["type"] = "robot".into();
    let text = serde_json::to_string_pretty(&v).expect("json");
    let line = 1 + text[..text.find("\"robot\"").expect("bad value")]
        .rfind("\n  {")
        .map_or(0, |at| text[..at + 1].matches('\n').count());
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, &text).expect("write");
    let before = stdout_json(&tooltune(&db, &["traces", "stats", "--json"]));

    let o = tooltune(&db, &["ingest", bad.to_str().expect("utf-8 path")]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("bad.json:{line}: column 3, [1].steps[0]")),
        "line {line}: {err}"
    );
    assert!(err.contains("nothing of this file was stored"), "{err}");
    let after = stdout_json(&tooltune(&db, &["traces", "stats", "--json"]));
    assert_eq!(before, after, "a rejected file changed the store");

    let o = tooltune(
        &db,
        &[
            "ingest",
            "--skip-invalid",
            "--json",
            bad.to_str().expect("utf-8 path"),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j = stdout_json(&o);
    let report = &j["files"][0]["report"];
    assert_eq!(report["added"], 2, "{j}");
    assert_eq!(report["skipped"][0]["line"], line as u64, "{j}");
    let message = report["skipped"][0]["message"].as_str().expect("message");
    assert!(message.starts_with("column 3, [1].steps[0]"), "{message}");
}

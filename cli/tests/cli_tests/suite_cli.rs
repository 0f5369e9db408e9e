//! `tooltune suite from-traces` through the binary: each sample log format ingested into a fresh store becomes a
//! suite verified on the lecture's real `week01-tools` server, which `suite check` then finds solvable; the same
//! without a server (written unverified, and said so); and the bad inputs (an empty store, filters nothing
//! matches, a server that does not start), each a clear message and no file.

use crate::ok_json;
use crate::tooltune;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use tooltune_evaluator::Suite;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cli has a parent")
        .to_path_buf()
}

/// Builds `week01-tools` beside the tooltune binary under test and returns its path.
fn week01() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_tooltune"));
    let dir = exe.parent().expect("bin dir").to_path_buf();
    let mut cmd = Command::new(env!("CARGO"));
    cmd.current_dir(workspace())
        .args(["build", "-q", "-p", "week01-tools"]);
    if dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    assert!(
        cmd.status().expect("cargo").success(),
        "building week01-tools"
    );
    dir.join("week01-tools")
}

/// The server's command line after `--`, as datasets/suites/week01-tools.toml starts it.
fn server_args(bin: &Path) -> Vec<String> {
    vec![
        "--".into(),
        bin.display().to_string(),
        "--data".into(),
        workspace()
            .join("datasets/week01-tools/data")
            .display()
            .to_string(),
        "--with-list-files".into(),
    ]
}

fn run(db: &str, dir: &Path, args: &[String]) -> Output {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    tooltune(db, dir, &args)
}

#[test]
fn every_sample_format_becomes_a_suite_verified_on_the_server_and_solvable() {
    let bin = week01();
    let mut figures = Vec::new();
    for format in ["tooltune", "openai", "langfuse", "otel"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("t.sqlite").display().to_string();
        let sample = workspace().join(format!("ingest/samples/{format}.jsonl"));
        let o = run(
            &db,
            dir.path(),
            &["ingest".into(), sample.display().to_string()],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

        let out = dir.path().join(format!("{format}.toml"));
        let mut args: Vec<String> = vec![
            "suite".into(),
            "from-traces".into(),
            "--out".into(),
            out.display().to_string(),
            "--json".into(),
        ];
        args.extend(server_args(&bin));
        let v = ok_json(&run(&db, dir.path(), &args));
        let made = v["from_traces"]["requests"].as_u64().expect("requests");
        let kept = v["kept"].as_u64().expect("kept");
        figures.push(format!("{format}: {made} requests, {kept} kept"));
        assert_eq!(v["from_traces"]["verified"], true, "{v}");
        // Sixteen runs a file; the tooltune file's one evaluator rollout is not a log of real use and is not read.
        let logged = if format == "tooltune" { 15 } else { 16 };
        assert_eq!(
            v["from_traces"]["trajectories"].as_u64(),
            Some(logged),
            "{format}: {v}"
        );

        let suite = Suite::load(&out).expect("the written suite loads");
        assert_eq!(suite.tasks.len() as u64, kept);
        // The lecture's request: owned by read_file (the successful runs read the file first), checked by the sum
        // every successful answer gave, made from the runs that name it.
        let notes = suite
            .tasks
            .iter()
            .find(|t| t.prompt.starts_with("Read notes.txt and sum"))
            .unwrap_or_else(|| panic!("{format}: the notes request was kept: {v}"));
        assert_eq!(notes.owner.as_deref(), Some("read_file"));
        assert_eq!(notes.answer.as_ref().and_then(|a| a.number), Some(69504.0));
        let p = notes.provenance.as_ref().expect("provenance");
        assert!(p.from_traces && p.verified == Some(true), "{p:?}");
        assert!(!p.trajectories.is_empty(), "{p:?}");
        // Answered without a tool in the log: a no-tool task.
        let capital = suite
            .tasks
            .iter()
            .find(|t| t.prompt.contains("capital of Australia"))
            .expect("the no-tool request");
        assert_eq!(capital.owner, None);
        assert!(!capital.forbid_tools.is_empty());
        // `list_dir` is not a tool of this server (it has list_files): those requests are dropped, by reason.
        assert!(
            v["dropped_by_reason"]["unknown-tool"].as_u64() >= Some(1),
            "{v}"
        );
        assert!(
            suite
                .tasks
                .iter()
                .all(|t| t.owner.as_deref() != Some("list_dir"))
        );

        // `suite check` runs every reference call again: all still solvable.
        let o = run(
            &db,
            dir.path(),
            &[
                "suite".into(),
                "check".into(),
                out.display().to_string(),
                "--json".into(),
            ],
        );
        let c = ok_json(&o);
        assert_eq!(c["tasks"].as_u64(), Some(kept), "{c}");
        let review = std::fs::read_to_string(out.with_extension("review.md")).expect("review page");
        assert!(
            review.contains(&format!("from {logged} logged runs")),
            "{review}"
        );
    }
    eprintln!("{}", figures.join("\n"));
}

#[test]
fn without_a_server_the_tasks_are_written_unverified_and_filters_apply() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("t.sqlite").display().to_string();
    let sample = workspace().join("ingest/samples/tooltune.jsonl");
    let o = run(
        &db,
        dir.path(),
        &["ingest".into(), sample.display().to_string()],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = dir.path().join("calc.toml");
    let v = ok_json(&run(
        &db,
        dir.path(),
        &[
            "suite".into(),
            "from-traces".into(),
            "--tool".into(),
            "calculator".into(),
            "--label-source".into(),
            "producer".into(),
            "--out".into(),
            out.display().to_string(),
            "--json".into(),
        ],
    ));
    assert_eq!(v["from_traces"]["verified"], false, "{v}");
    let text = std::fs::read_to_string(&out).expect("written");
    assert!(
        text.contains("NOT run") && text.contains("replace-with-the-server-command"),
        "{text}"
    );
    let suite = Suite::load(&out).expect("loads");
    assert!(!suite.tasks.is_empty());
    for t in &suite.tasks {
        assert_eq!(
            t.owner.as_deref(),
            Some("calculator"),
            "--tool keeps only its requests"
        );
        assert_eq!(t.provenance.as_ref().and_then(|p| p.verified), Some(false));
    }

    // A window with no run in it: a clear error and no file.
    let late = dir.path().join("late.toml");
    let o = run(
        &db,
        dir.path(),
        &[
            "suite".into(),
            "from-traces".into(),
            "--since".into(),
            "2031-01-01".into(),
            "--out".into(),
            late.display().to_string(),
        ],
    );
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("no logged run") && e.contains("--since 2031-01-01"),
        "{e}"
    );
    assert!(!late.exists());
    // A window that holds the sample's day keeps its runs; a malformed date is refused by name.
    let day = dir.path().join("day.toml");
    let v = ok_json(&run(
        &db,
        dir.path(),
        &[
            "suite".into(),
            "from-traces".into(),
            "--since".into(),
            "2025-06-02".into(),
            "--until".into(),
            "2025-06-02".into(),
            "--out".into(),
            day.display().to_string(),
            "--json".into(),
        ],
    ));
    // The file's sixteen runs but its one evaluator rollout.
    assert_eq!(v["from_traces"]["trajectories"].as_u64(), Some(15), "{v}");
    let o = run(
        &db,
        dir.path(),
        &[
            "suite".into(),
            "from-traces".into(),
            "--until".into(),
            "June 2".into(),
        ],
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("--until \"June 2\""));
}

#[test]
fn an_empty_store_or_a_server_that_does_not_start_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("empty.sqlite").display().to_string();
    let out = dir.path().join("s.toml");
    let base: Vec<String> = vec![
        "suite".into(),
        "from-traces".into(),
        "--out".into(),
        out.display().to_string(),
    ];
    let o = run(&db, dir.path(), &base);
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("holds no logged run") && e.contains("tooltune ingest"),
        "{e}"
    );
    assert!(!out.exists() && !out.with_extension("review.md").exists());

    let sample = workspace().join("ingest/samples/openai.jsonl");
    let o = run(
        &db,
        dir.path(),
        &["ingest".into(), sample.display().to_string()],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut args = base.clone();
    args.extend(["--".into(), "/nonexistent/tooltune-no-such-server".into()]);
    let o = run(&db, dir.path(), &args);
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("did not start") && e.contains("tooltune-no-such-server"),
        "{e}"
    );
    assert!(!out.exists() && !out.with_extension("review.md").exists());
}

//! `tooltune traces label` through the binary, on a chat-completions log without outcomes (the bundled OpenAI
//! sample with its outcome fields removed): the heuristics label every run, the labels are stored apart (the
//! trajectories and their ids do not change, labelling again replaces), and `traces stats` counts them only when
//! asked to use labels, saying where each verdict came from.

use crate::tooltune;
use serde_json::Value;
use std::path::Path;
use std::process::Output;

fn json_of(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

/// The OpenAI sample without its outcome fields: a log as chat-completions producers write it.
fn log_without_outcomes(dir: &Path) -> String {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ingest/samples/openai.jsonl");
    let text = std::fs::read_to_string(src).expect("sample");
    let lines: Vec<String> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).expect("sample line");
            // The outcome fields are ours, at the top level or in `metadata` (docs/trace-format.md).
            let o = v.as_object_mut().expect("object");
            for k in ["score", "success", "feedback"] {
                o.remove(k);
                if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove(k);
                }
            }
            v.to_string()
        })
        .collect();
    let path = dir.join("chat-log.jsonl");
    std::fs::write(&path, lines.join("\n")).expect("write log");
    path.display().to_string()
}

fn tool_total<'a>(stats: &'a Value, tool: &str) -> &'a Value {
    stats["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .find(|r| r["tool"] == tool && r["description_id"].is_null())
        .unwrap_or_else(|| panic!("no total row for {tool}: {stats}"))
}

#[test]
fn heuristic_labels_fill_in_missing_outcomes_without_touching_the_trajectories() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("t.sqlite").display().to_string();
    let log = log_without_outcomes(dir.path());
    let ingested = json_of(&tooltune(&db, dir.path(), &["ingest", "--json", &log]));
    let n = ingested["files"][0]["report"]["added"]
        .as_u64()
        .expect("added");
    assert_eq!(n, 16, "{ingested}");

    // No outcome anywhere: no success figure for any tool.
    let stats = json_of(&tooltune(&db, dir.path(), &["traces", "stats", "--json"]));
    for row in stats["tools"].as_array().expect("tools") {
        assert_eq!(row["success_when_chosen"]["trials"], 0, "{row}");
    }
    let ids_before = trajectory_ids(&db);

    let labelled = json_of(&tooltune(&db, dir.path(), &["traces", "label", "--json"]));
    assert_eq!(labelled["selected"], 16, "{labelled}");
    assert!(labelled["judge"].is_null());
    assert!(
        labelled.get("agreement").is_none(),
        "no outcomes to agree with"
    );
    let rows = labelled["trajectories"].as_array().expect("rows");
    let failed = rows
        .iter()
        .filter(|r| r["heuristic"]["success"] == false)
        .count();
    assert_eq!(labelled["heuristic"]["failed"], failed as u64);
    assert!(failed > 0 && failed < 16, "{labelled}");
    for r in rows {
        let fb = r["heuristic"]["feedback"].as_str().expect("feedback");
        if r["heuristic"]["success"] == false {
            // A failure names the rule that fired.
            assert!(
                [
                    "tool_error:",
                    "repeated_call:",
                    "turn_limit:",
                    "no_final_answer:",
                    "gave_up:"
                ]
                .iter()
                .any(|rule| fb.starts_with(rule)),
                "{fb}"
            );
            assert_eq!(r["heuristic"]["score"], 0.0);
        } else {
            assert!(fb.starts_with("no failure evidence"), "{fb}");
            assert!(r["heuristic"]["score"].is_null());
        }
        assert!(r["producer_success"].is_null());
    }
    // The sample has tool errors (a missing file): that rule is among those counted.
    assert!(
        labelled["heuristic"]["rules"]["tool_error"]
            .as_u64()
            .unwrap_or(0)
            > 0,
        "{labelled}"
    );

    // Stats with labels (the default): success verdicts now exist, every one from a heuristic label.
    let stats = json_of(&tooltune(&db, dir.path(), &["traces", "stats", "--json"]));
    assert_eq!(stats["labels"], "use");
    let rf = tool_total(&stats, "read_file");
    let trials = rf["success_when_chosen"]["trials"]
        .as_u64()
        .expect("trials");
    assert!(trials > 0, "{rf}");
    assert_eq!(rf["verdicts"]["heuristic"]["judged"], trials);
    assert_eq!(rf["verdicts"]["producer"]["judged"], 0);
    assert_eq!(
        rf["verdicts"]["heuristic"]["succeeded"],
        rf["success_when_chosen"]["hits"]
    );
    let text = tooltune(&db, dir.path(), &["traces", "stats"]);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("success verdicts: heuristic label"),
        "{}",
        String::from_utf8_lossy(&text.stdout)
    );
    // Ignored: as before labelling.
    let ignored = json_of(&tooltune(
        &db,
        dir.path(),
        &["traces", "stats", "--labels", "ignore", "--json"],
    ));
    assert_eq!(
        tool_total(&ignored, "read_file")["success_when_chosen"]["trials"],
        0
    );

    // Labelling again replaces: the same labels, the same trajectories with the same ids.
    let again = json_of(&tooltune(
        &db,
        dir.path(),
        &["traces", "label", "--tool", "read_file", "--json"],
    ));
    assert!(again["selected"].as_u64().expect("n") > 0);
    assert_eq!(trajectory_ids(&db), ids_before);
    assert_eq!(count_labels(&db), 16);
    let stats_again = json_of(&tooltune(&db, dir.path(), &["traces", "stats", "--json"]));
    assert_eq!(tool_total(&stats_again, "read_file"), rf);
}

#[test]
fn bad_arguments_name_the_argument_and_what_to_do() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("t.sqlite").display().to_string();
    let log = log_without_outcomes(dir.path());
    assert!(
        tooltune(&db, dir.path(), &["ingest", &log])
            .status
            .success()
    );
    let o = tooltune(
        &db,
        dir.path(),
        &["traces", "label", "--since", "03/12/2026"],
    );
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("--since 03/12/2026: expected a date YYYY-MM-DD"),
        "{e}"
    );
    let o = tooltune(
        &db,
        dir.path(),
        &["traces", "label", "--tool", "no_such_tool"],
    );
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("--tool no_such_tool: no stored trajectory showed this tool")
            && e.contains("traces stats"),
        "{e}"
    );
    let o = tooltune(&db, dir.path(), &["traces", "stats", "--labels", "maybe"]);
    assert!(!o.status.success());
    // Nothing from the future: an empty selection is not an error.
    let o = tooltune(
        &db,
        dir.path(),
        &["traces", "label", "--since", "2999-01-01"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("nothing to label"));
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("runtime")
}

fn trajectory_ids(db: &str) -> Vec<String> {
    runtime().block_on(async {
        let store = tooltune_store::Store::open(db).await.expect("store");
        let mut ids: Vec<String> = store
            .trajectory_ids(None, 1000)
            .await
            .expect("ids")
            .into_iter()
            .map(|i| i.as_str().to_string())
            .collect();
        ids.sort();
        ids
    })
}

fn count_labels(db: &str) -> u64 {
    runtime().block_on(async {
        let store = tooltune_store::Store::open(db).await.expect("store");
        store.count_labels(None).await.expect("count")
    })
}

//! Catalog suites end to end (issue 47) with the real 0.5B model: the README's hand-written help-desk catalog is
//! scored by exact first moves with no server running, what needs a server is refused naming the suite, a routing
//! search on it runs on screens alone and exports every tool, and `tooltune rewrite` writes its baseline.

use crate::ok_json;
use std::path::{Path, PathBuf};

fn catalog() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../datasets/suites/catalog/helpdesk.toml")
        .display()
        .to_string()
}

fn setup() -> (tempfile::TempDir, String, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = format!("sqlite://{}", dir.path().join("t.db").display());
    let data = dir.path().to_path_buf();
    (dir, db, data)
}

#[test]
fn a_catalog_is_scored_by_first_moves_and_refuses_what_needs_a_server() {
    let (_dir, db, data) = setup();
    let suite = catalog();
    let v = ok_json(&crate::tooltune(
        &db,
        &data,
        &["eval", "--suite", &suite, "--model", "local:fast", "--json"],
    ));
    let r = &v["result"];
    assert_eq!(r["mode"], "selection_only", "{r}");
    let tasks = r["tasks"].as_array().expect("tasks");
    assert_eq!(tasks.len(), 12);
    for t in tasks {
        let p = t["routing_probability"].as_f64().expect("exact routing");
        assert!((0.0..=1.0).contains(&p), "{t}");
        // First moves only: nothing ran. `called` holds the likeliest first move (none when answering without a
        // tool is likelier), no answer, no stored trajectory.
        assert!(t["called"].as_array().is_some_and(|c| c.len() <= 1), "{t}");
        assert!(
            t["final_answer"].is_null() && t["trajectory_id"].is_null(),
            "{t}"
        );
    }
    let mean = r["expected_routing"].as_f64().expect("mean");
    let by_hand = tasks
        .iter()
        .filter_map(|t| t["routing_probability"].as_f64())
        .sum::<f64>()
        / 12.0;
    assert!((mean - by_hand).abs() < 1e-9, "{mean} vs {by_hand}");

    for (args, what) in [
        (
            vec![
                "eval",
                "--suite",
                &suite,
                "--model",
                "local:fast",
                "--expected-success",
            ],
            "expected success",
        ),
        (
            vec![
                "optimize",
                "--suite",
                &suite,
                "--model",
                "local:fast",
                "--reflector",
                "local:fast",
            ],
            "task-success objective",
        ),
        (
            vec![
                "optimize",
                "--suite",
                &suite,
                "--objective",
                "routing",
                "--no-screen",
                "--model",
                "local:fast",
                "--reflector",
                "local:fast",
            ],
            "without exact screens",
        ),
    ] {
        let o = crate::tooltune(&db, &data, &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} should fail");
        assert!(
            err.contains("suite `helpdesk-catalog` is a catalog") && err.contains(what),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn a_routing_search_on_a_catalog_runs_on_screens_and_rewrite_writes_its_baseline() {
    let (dir, db, data) = setup();
    let suite = catalog();
    let export = dir.path().join("winner.json");
    let export_s = export.display().to_string();
    let v = ok_json(&crate::tooltune(
        &db,
        &data,
        &[
            "optimize",
            "--suite",
            &suite,
            "--objective",
            "routing",
            "--tool",
            "search_docs",
            "--tool",
            "search_tickets",
            "--tool",
            "web_search",
            "--max-screened",
            "12",
            "--proposals",
            "2",
            "--model",
            "local:fast",
            "--reflector",
            "local:fast",
            "--export",
            &export_s,
            "--json",
        ],
    ));
    // The search's counters stand at the summary's top level.
    assert_eq!(v["rollouts"].as_u64(), Some(0), "{v}");
    assert!(v["screened"].as_u64().is_some_and(|s| s > 0), "{v}");
    // The held-out split was screened, not rolled out: a routing comparison over all six test tasks.
    assert!(v["test"]["routing_p_value"].is_number(), "{}", v["test"]);
    assert_eq!(
        v["test"]["routing_deltas"].as_array().map(Vec::len),
        Some(6),
        "{}",
        v["test"]
    );
    let winner: std::collections::BTreeMap<String, String> =
        serde_json::from_str(&std::fs::read_to_string(&export).expect("export")).expect("json");
    assert_eq!(
        winner.keys().collect::<Vec<_>>(),
        ["search_docs", "search_tickets", "web_search"]
    );

    let baseline = dir.path().join("rewrite.json");
    let baseline_s = baseline.display().to_string();
    let v = ok_json(&crate::tooltune(
        &db,
        &data,
        &[
            "rewrite",
            "--suite",
            &suite,
            "--reflector",
            "local:fast",
            "--model",
            "local:fast",
            "--export",
            &baseline_s,
            "--json",
        ],
    ));
    let set = &v["sets"][0];
    let written: std::collections::BTreeMap<String, String> =
        serde_json::from_str(&std::fs::read_to_string(&baseline).expect("export")).expect("json");
    assert_eq!(
        written,
        serde_json::from_value(set["descriptions"].clone()).expect("map")
    );
    // Every tool is either rewritten or named with the reason it kept its text.
    let rejected = set["rejected"].as_object().expect("rejected").len();
    assert_eq!(written.len() + rejected, 3, "{set}");
    for d in written.values() {
        assert!(!d.trim().is_empty() && d.len() <= 400, "{d}");
    }
}

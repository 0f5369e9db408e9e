//! Tests of the suite module: loading (good suites, and each kind of mistake named precisely), fixtures, and the
//! checks that score a rollout, run on suites parsed from text.

use super::*;
use crate::mcp::{ProtocolPref, Transport};
use std::path::Path;

const GOOD: &str = r#"
name = "demo"
tools_under_study = ["read_file"]

[server]
command = "${SUITE_DIR}/srv"
args = ["--data", "${SUITE_DIR}/data"]
env = { LANG = "C" }
protocol = "2026-07-28"

[[task]]
id = "notes-sum"
prompt = "Read notes.txt and sum the numbers in it."
split = "train"
owner = "read_file"
answer.number = 69504
expect_tools = ["read_file", "calculator"]

[[task]]
id = "who"
prompt = "Who is the treasurer?"
split = "test"
owner = "read_file"
answer.contains = "Joon Lee"
forbid_tools = ["calculator"]
max_steps = 3
"#;

fn parse(text: &str) -> Result<Suite, EvalError> {
    Suite::parse(Path::new("suites/demo.toml"), text)
}

fn err_text(text: &str) -> String {
    parse(text).expect_err("should fail").to_string()
}

#[test]
fn loads_a_good_suite_and_expands_variables() {
    let s = parse(GOOD).expect("good suite");
    assert_eq!(s.name, "demo");
    assert_eq!(s.tasks.len(), 2);
    assert_eq!(s.tasks[0].max_steps, DEFAULT_MAX_STEPS);
    assert_eq!(s.tasks[1].max_steps, 3);
    assert!(s.tasks[0].expect_order);
    assert_eq!(s.split(Split::Test).count(), 1);
    assert_eq!(
        s.server.protocol,
        ProtocolPref::Version("2026-07-28".into())
    );
    match &s.server.transport {
        Transport::Stdio {
            command, args, env, ..
        } => {
            assert!(
                command.ends_with("/srv") && !command.contains("${"),
                "{command}"
            );
            assert!(args[1].ends_with("/data"), "{args:?}");
            assert_eq!(env.get("LANG").map(String::as_str), Some("C"));
        }
        other => panic!("expected stdio, got {other:?}"),
    }
}

#[test]
fn syntax_errors_name_file_and_line() {
    let e = err_text("tools_under_study = [\"a\"]\n[server\ncommand = 1\n");
    assert!(e.starts_with("suites/demo.toml:2: "), "{e}");
}

#[test]
fn unknown_field_names_task_and_field() {
    let bad = GOOD.replace(
        "answer.contains = \"Joon Lee\"",
        "answr.contains = \"Joon Lee\"",
    );
    let e = err_text(&bad);
    assert!(e.contains("suites/demo.toml:"), "{e}");
    assert!(e.contains("task `who` (#2)"), "{e}");
    assert!(e.contains("answr"), "{e}");
}

#[test]
fn wrong_type_names_the_field_path() {
    let bad = GOOD.replace("answer.number = 69504", "answer.number = \"lots\"");
    let e = err_text(&bad);
    assert!(e.contains("task `notes-sum` (#1)"), "{e}");
    assert!(e.contains("field `answer.number`"), "{e}");
}

#[test]
fn unknown_split_is_refused() {
    let e = err_text(&GOOD.replace("split = \"test\"", "split = \"dev\""));
    assert!(
        e.contains("task `who` (#2)") && e.contains("field `split`"),
        "{e}"
    );
    assert!(e.contains("dev"), "{e}");
}

#[test]
fn bad_regex_is_refused_with_its_field() {
    let bad = GOOD.replace(
        "answer.contains = \"Joon Lee\"",
        "answer.regex = \"(unclosed\"",
    );
    let e = err_text(&bad);
    assert!(
        e.contains("task `who` (#2): field `answer.regex`: does not compile"),
        "{e}"
    );
}

#[test]
fn duplicate_ids_and_checkless_tasks_are_refused() {
    let e = err_text(&GOOD.replace("id = \"who\"", "id = \"notes-sum\""));
    assert!(e.contains("field `id`: duplicate id `notes-sum`"), "{e}");
    let bad = GOOD
        .replace("answer.contains = \"Joon Lee\"\n", "")
        .replace("forbid_tools = [\"calculator\"]\n", "");
    let e = err_text(&bad);
    assert!(
        e.contains("task `who` (#2)") && e.contains("has no check"),
        "{e}"
    );
}

#[test]
fn server_section_is_validated() {
    let e = err_text(&GOOD.replace("protocol = \"2026-07-28\"", "protocol = \"2027-01-01\""));
    assert!(e.contains("field `server.protocol`"), "{e}");
    let e = err_text(&GOOD.replace("${SUITE_DIR}/srv", "${HOME}/srv"));
    assert!(
        e.contains("field `server.command`") && e.contains("${HOME}"),
        "{e}"
    );
    let e = err_text(&GOOD.replace(
        "command = \"${SUITE_DIR}/srv\"",
        "command = \"x\"\nurl = \"http://127.0.0.1:1/mcp\"",
    ));
    assert!(e.contains("not both"), "{e}");
}

#[test]
fn check_scores_answer_and_tools() {
    let s = parse(GOOD).expect("good");
    let t = &s.tasks[0];
    let r = t.check(Some("The total is 69,504."), &["read_file", "calculator"]);
    assert!(r.success, "{r:?}");
    assert_eq!(r.score, 1.0);

    let r = t.check(Some("The total is 69494."), &["read_file"]);
    assert!(!r.success);
    assert_eq!(r.score, 0.0);
    assert!(
        r.feedback.contains("the answer's numbers are 69494"),
        "{}",
        r.feedback
    );
    assert!(r.feedback.contains("calculator was not"), "{}", r.feedback);

    let r = t.check(Some("69504"), &["calculator", "read_file"]);
    assert!(!r.success);
    assert_eq!(r.score, 0.5);
    assert!(r.feedback.contains("in this order"), "{}", r.feedback);

    let r = t.check::<&str>(None, &[]);
    assert!(
        !r.success && r.feedback.contains("no final answer"),
        "{r:?}"
    );

    let who = &s.tasks[1];
    assert!(who.check(Some("It is joon lee."), &["read_file"]).success);
    let r = who.check(Some("Joon Lee"), &["read_file", "calculator"]);
    assert!(
        !r.success && r.feedback.contains("must not be used"),
        "{r:?}"
    );
}

#[test]
fn numbers_are_read_like_a_person_would() {
    assert_eq!(numbers_in("69,504 total"), vec![69504.0]);
    assert_eq!(numbers_in("4, 48000 and 9500"), vec![4.0, 48000.0, 9500.0]);
    assert_eq!(numbers_in("on 2026-09-01"), vec![2026.0, 9.0, 1.0]);
    assert_eq!(numbers_in("it is -3.5 or 0.875"), vec![-3.5, 0.875]);
    assert_eq!(numbers_in("code QM-4092 in v2"), vec![4092.0]);
    assert_eq!(numbers_in("2:21:47"), vec![2.0, 21.0, 47.0]);
    assert_eq!(numbers_in("1,2345"), vec![1.0, 2345.0]);
}

#[test]
fn exact_regex_and_found_in() {
    let a = AnswerCheck {
        exact: Some("Hanbit Hall".into()),
        regex: None,
        number: None,
        tolerance: 0.0,
        contains: vec![],
        ignore_case: true,
    };
    assert!(a.failures("hanbit hall.").is_empty());
    assert!(!a.failures("It is Hanbit Hall").is_empty());
    assert!(a.found_in("Last year's venue: Hanbit Hall"));
    let n = AnswerCheck {
        exact: None,
        regex: Some(Regex::new(r"\b0?5:30\b").expect("regex")),
        number: Some(7.0),
        tolerance: 0.0,
        contains: vec![],
        ignore_case: false,
    };
    assert!(n.found_in("retries 7 times, at 05:30"));
    assert!(!n.found_in("retries 17 times, at 05:30"));
}

/// A suite file with a fixture folder beside it, in a temporary folder.
fn with_fixture(
    server: &str,
    extra: &str,
    task_checks: &str,
) -> (tempfile::TempDir, Result<Suite, EvalError>) {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::create_dir_all(dir.path().join("world")).expect("mkdir");
    std::fs::write(dir.path().join("world/a.txt"), "a").expect("write");
    let text = format!(
        "tools_under_study = [\"t\"]\n{extra}\n[server]\n{server}\n\n[[task]]\nid = \"x\"\nprompt = \"p\"\n\
         split = \"test\"\n{task_checks}\n"
    );
    let path = dir.path().join("s.toml");
    std::fs::write(&path, &text).expect("write");
    let r = Suite::load(&path);
    (dir, r)
}

#[test]
fn a_fixture_suite_keeps_the_fixture_variable_for_each_rollout_and_checks_files() {
    let (dir, r) = with_fixture(
        "command = \"srv\"\nargs = [\"--root\", \"${FIXTURE_DIR}\"]",
        "[fixture]\npath = \"world\"\n[host]\nsystem_prompt = \"Be brief.\"",
        "expect_file = [{ path = \"a.txt\", contains = [\"a\"] }, { path = \"gone.txt\", exists = false }]",
    );
    let s = r.unwrap_or_else(|e| panic!("{e}"));
    let f = s.fixture.as_ref().expect("fixture");
    assert!(f.source.ends_with("world"));
    assert_eq!(
        f.digest,
        crate::fixture::digest(&dir.path().join("world")).expect("digest")
    );
    assert_eq!(s.world_digest(), f.digest);
    assert_eq!(s.system_prompt.as_deref(), Some("Be brief."));
    let Transport::Stdio { args, .. } = &s.server.transport else {
        panic!("stdio")
    };
    assert_eq!(args[1], "${FIXTURE_DIR}");
    assert_eq!(s.tasks[0].expect_files.len(), 2);
    assert!(!s.tasks[0].expect_files[1].exists);
    // A world check is a check group of its own.
    let r = s.tasks[0].check_with_world(
        Some("ok"),
        &["t"],
        &[(true, "a".into()), (false, "b".into())],
    );
    assert!(!r.success);
    assert!((r.score - 0.5).abs() < 1e-12);
    assert!(r.feedback.contains('b'));
}

#[test]
fn fixture_mistakes_are_named() {
    let cases = [
        // The variable without a fixture.
        (
            "command = \"srv\"\nargs = [\"${FIXTURE_DIR}\"]",
            "",
            "answer.contains = \"a\"",
            "needs a [fixture]",
        ),
        // A fixture the server never uses.
        (
            "command = \"srv\"",
            "[fixture]\npath = \"world\"",
            "answer.contains = \"a\"",
            "never names ${FIXTURE_DIR}",
        ),
        // A fixture for a URL server.
        (
            "url = \"http://127.0.0.1:1/mcp\"",
            "[fixture]\npath = \"world\"",
            "answer.contains = \"a\"",
            "needs a `command` server",
        ),
        // A missing fixture.
        (
            "command = \"${FIXTURE_DIR}/srv\"",
            "[fixture]\npath = \"nowhere\"",
            "answer.contains = \"a\"",
            "does not exist",
        ),
        // File checks without a fixture.
        (
            "command = \"srv\"",
            "",
            "expect_file = [{ path = \"a.txt\" }]",
            "has no [fixture]",
        ),
        // A path out of the fixture.
        (
            "command = \"${FIXTURE_DIR}/srv\"",
            "[fixture]\npath = \"world\"",
            "expect_file = [{ path = \"../etc/passwd\" }]",
            "inside the fixture",
        ),
        // Content checks on a file that must be gone.
        (
            "command = \"${FIXTURE_DIR}/srv\"",
            "[fixture]\npath = \"world\"",
            "expect_file = [{ path = \"a.txt\", exists = false, contains = [\"a\"] }]",
            "cannot be combined",
        ),
        // A reset command with a bad timeout.
        (
            "command = \"srv\"",
            "[reset]\ncommand = \"true\"\ntimeout_secs = 0",
            "answer.contains = \"a\"",
            "reset.timeout_secs",
        ),
        // An empty host prompt.
        (
            "command = \"srv\"",
            "[host]\nsystem_prompt = \" \"",
            "answer.contains = \"a\"",
            "host.system_prompt",
        ),
    ];
    for (server, extra, checks, want) in cases {
        let (_dir, r) = with_fixture(server, extra, checks);
        let msg = r.expect_err(want).to_string();
        assert!(msg.contains(want), "{want:?} not in {msg:?}");
        assert!(msg.contains("s.toml"), "{msg}");
    }
}

#[test]
fn provenance_is_read_and_its_fields_are_checked() {
    let text = GOOD.replace(
        "max_steps = 3\n",
        "max_steps = 3\nprovenance = { drafted = true, model = \"local:fast\", kind = \"tool\", check = \"answer\", \
         reference_sha256 = \"sha256:ab\" }\n",
    );
    let s = parse(&text).expect("suite with provenance");
    assert_eq!(s.tasks[0].provenance, None, "a hand-written task has none");
    let p = s.tasks[1].provenance.as_ref().expect("provenance");
    assert!(p.drafted);
    assert_eq!(p.model.as_deref(), Some("local:fast"));
    assert_eq!(p.check.as_deref(), Some("answer"));
    assert_eq!(p.reference_sha256.as_deref(), Some("sha256:ab"));
    let e = err_text(&text.replace("drafted = true", "drafter = true"));
    assert!(
        e.contains("task `who` (#2)") && e.contains("provenance") && e.contains("drafter"),
        "{e}"
    );
}

#[test]
fn task_lines_are_the_headers_in_file_order() {
    let lines = task_lines(GOOD);
    assert_eq!(lines.len(), 2);
    for (l, id) in lines.iter().zip(["notes-sum", "who"]) {
        let next = GOOD.lines().nth(*l).expect("line after the header");
        assert_eq!(next, format!("id = \"{id}\""));
    }
}

const CATALOG: &str = r#"
name = "cat"

[[tool]]
name = "search_docs"
description = "Search the documentation."
input_schema = { type = "object", properties = { query = { type = "string" } } }
annotations = { readOnlyHint = true }

[[tool]]
name = "web_search"
description = "Search the web."

[[task]]
id = "docs"
prompt = "How do I turn on single sign-on?"
split = "train"
owner = "search_docs"

[[task]]
id = "thanks"
prompt = "Thanks, that's all."
split = "test"
"#;

#[test]
fn a_catalog_suite_declares_its_tools_and_needs_no_check() {
    let s = parse(CATALOG).expect("catalog suite");
    assert!(s.is_catalog());
    // No tools_under_study: every declared tool is studied.
    assert_eq!(s.tools_under_study, ["search_docs", "web_search"]);
    let Transport::Catalog { tools } = &s.server.transport else {
        panic!("not a catalog: {:?}", s.server.transport);
    };
    assert_eq!(
        tools[0].annotations.and_then(|a| a.read_only_hint),
        Some(true)
    );
    // A tool declared without a schema gets an empty object schema, as MCP requires one.
    assert_eq!(
        tools[1].input_schema,
        serde_json::json!({"type": "object", "properties": {}})
    );
    assert_eq!(s.tasks[1].owner, None);
    assert!(s.needs_server("a full evaluation").is_err());
    assert!(parse(GOOD).expect("server suite").needs_server("x").is_ok());
}

#[test]
fn catalog_mistakes_are_named() {
    let checked = CATALOG.replace(
        "owner = \"search_docs\"",
        "owner = \"search_docs\"\nanswer.contains = \"SSO\"",
    );
    let e = err_text(&checked);
    assert!(
        e.contains("`docs` (#1)") && e.contains("answer") && e.contains("first move only"),
        "{e}"
    );
    let e = err_text(&CATALOG.replace("owner = \"search_docs\"", "owner = \"search_doc\""));
    assert!(e.contains("owner") && e.contains("`search_doc`"), "{e}");
    let e = err_text(&CATALOG.replace("name = \"web_search\"", "name = \"search_docs\""));
    assert!(e.contains("tool[1].name") && e.contains("duplicate"), "{e}");
    let e = err_text(&format!("{CATALOG}\n[server]\ncommand = \"srv\"\n"));
    assert!(e.contains("not both"), "{e}");
    let e = err_text(&CATALOG.replace(
        "description = \"Search the web.\"",
        "description = \"Search the web.\"\ninput_schema = { type = \"string\" }",
    ));
    assert!(
        e.contains("tool[1].input_schema") && e.contains("object"),
        "{e}"
    );
    let e = err_text("name = \"x\"\n[[task]]\nid = \"a\"\nprompt = \"p\"\nsplit = \"train\"\n");
    assert!(e.contains("[server]") && e.contains("catalog"), "{e}");
}

#[test]
fn a_catalog_reads_a_saved_tools_list_result() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("tools.json"),
        r#"{"tools": [{"name": "search_docs", "title": "Docs", "description": "Search the documentation.",
            "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}}},
           {"name": "web_search", "inputSchema": {"type": "object"}}]}"#,
    )
    .expect("write");
    let text = "tools = \"tools.json\"\n\n[[task]]\nid = \"a\"\nprompt = \"SSO?\"\nsplit = \"train\"\nowner = \"search_docs\"\n";
    let s = Suite::parse(&dir.path().join("s.toml"), text).expect("catalog from a file");
    let Transport::Catalog { tools } = &s.server.transport else {
        panic!("not a catalog");
    };
    assert_eq!(tools.len(), 2);
    assert_eq!(tools[1].description, "");
    std::fs::write(dir.path().join("tools.json"), "{\"tools\": [{\"nam\": 1}]}").expect("write");
    let e = Suite::parse(&dir.path().join("s.toml"), text)
        .expect_err("bad file")
        .to_string();
    assert!(
        e.contains("tools.json: at `tools[0]`") && e.contains("name") && e.contains("tools/list"),
        "{e}"
    );
    std::fs::write(dir.path().join("tools.json"), "{\"tools\": [").expect("write");
    let e = Suite::parse(&dir.path().join("s.toml"), text)
        .expect_err("not JSON")
        .to_string();
    assert!(e.contains("tools.json:1:") && e.contains("not JSON"), "{e}");
}

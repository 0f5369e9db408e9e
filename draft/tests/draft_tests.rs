//! `suite draft` and `suite check` against real MCP servers: the lecture's `week01-tools` (built into the profile
//! folder) and a bare Python server for the bad inputs. The verification rules are held with a scripted fake
//! drafter (its replies follow the prompt's content, so each drop reason is produced on purpose); the whole path is
//! run once more with the real embedded model (0.5B).

use async_trait::async_trait;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::AtomicBool;
use std::time::Duration;
use tooltune_core::{ToolCall, Usage};
use tooltune_draft::draft::{DropReason, TaskCheck};
use tooltune_draft::parse::Check;
use tooltune_draft::{Counts, DraftConfig, DraftError, Finding, check_suite, draft};
use tooltune_evaluator::{ServerSpec, Suite};
use tooltune_llm::{
    ChatModel, ChatRequest, ChatResponse, FinishReason, LlmError, Message, ToolChoice,
};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("draft has a parent")
        .to_path_buf()
}

/// Builds `week01-tools` once into the profile folder (where `${TOOLTUNE_BIN_DIR}` points) and returns its path.
fn week01_bin() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = tooltune_evaluator::suite::bin_dir();
            let mut cmd = Command::new(env!("CARGO"));
            cmd.current_dir(workspace())
                .args(["build", "-q", "-p", "week01-tools"]);
            if dir.file_name().is_some_and(|n| n == "release") {
                cmd.arg("--release");
            }
            assert!(
                cmd.status().expect("cargo runs").success(),
                "building week01-tools failed"
            );
            dir.join("week01-tools")
        })
        .clone()
}

fn week01_spec() -> ServerSpec {
    let data = workspace().join("datasets/week01-tools/data");
    ServerSpec::stdio(
        "week01-tools",
        week01_bin().to_string_lossy(),
        &["--data", &data.to_string_lossy(), "--with-list-files"],
    )
}

fn bare_spec(args: &[&str]) -> ServerSpec {
    let script = workspace().join("draft/tests/servers/bare_server.py");
    let mut all = vec![script.to_string_lossy().into_owned()];
    all.extend(args.iter().map(|s| s.to_string()));
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    ServerSpec::stdio("bare", "python3", &all)
}

fn config(server: ServerSpec, out: PathBuf, counts: Counts) -> DraftConfig {
    DraftConfig {
        server,
        fixture: None,
        out,
        name: None,
        counts,
        seed: 0,
        call_timeout: Duration::from_secs(10),
        more: false,
    }
}

/// Text between the first `start` and the next `end` after it.
fn between<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
    let from = text.find(start).map(|i| i + start.len()).unwrap_or(0);
    let rest = &text[from..];
    &rest[..rest.find(end).unwrap_or(rest.len())]
}

/// A scripted fake drafter. It reads the prompt and answers as a model would, by rules that make each of the
/// verification's outcomes happen: lists of requests per tool (with a duplicate and a line naming a tool), forced
/// calls chosen from the request's words (one names a file that does not exist), and verdicts (one "no", one
/// unreadable, the others the value that answers). Stateless, so batches get the same replies as single requests.
struct ScriptedFakeDrafter {
    /// What every reply says instead, to test a model that writes nothing usable.
    babble: Option<&'static str>,
}

fn text_reply(s: &str) -> ChatResponse {
    ChatResponse {
        content: Some(s.to_string()),
        tool_calls: Vec::new(),
        usage: Usage::default(),
        finish_reason: FinishReason::Stop,
    }
}

#[async_trait]
impl ChatModel for ScriptedFakeDrafter {
    fn id(&self) -> String {
        "fake:scripted-drafter".into()
    }

    async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let user = req
            .messages
            .iter()
            .rev()
            .find_map(|m| match m {
                Message::User { content } => Some(content.as_str()),
                _ => None,
            })
            .unwrap_or("");
        if let ToolChoice::Tool(name) = &req.tool_choice {
            let args = match name.as_str() {
                "calculator" => json!({"expression": "17 * 23"}),
                "read_file" if user.contains("moon") => json!({"path": "moon.txt"}),
                "read_file" if user.contains("recipe") => json!({"path": "recipe.txt"}),
                "read_file" if user.contains("team") => json!({"path": "team.txt"}),
                "read_file" => json!({"path": "notes.txt"}),
                "list_files" if user.contains("reports") => json!({"path": "reports"}),
                "list_files" => json!({}),
                _ => json!({"key": "a"}),
            };
            return Ok(ChatResponse {
                content: None,
                tool_calls: vec![ToolCall {
                    id: None,
                    name: name.clone(),
                    arguments: args,
                }],
                usage: Usage::default(),
                finish_reason: FinishReason::ToolCalls,
            });
        }
        if let Some(b) = self.babble {
            return Ok(text_reply(b));
        }
        if user.contains("ANSWERS: <yes or no>") {
            let request = between(user, "A user asked: «", "»");
            let result = between(user, "returned:\n«", "»");
            let reply = if request.contains("recipe") {
                "ANSWERS: no\nVALUE: none".to_string()
            } else if request.contains("memo") {
                "I think it does, mostly.".to_string()
            } else if result.contains("391") {
                "ANSWERS: yes\nVALUE: 391".to_string()
            } else if result.contains("Joon Lee") {
                "ANSWERS: yes\nVALUE: Joon Lee".to_string()
            } else if result.contains("q1.txt") {
                "ANSWERS: yes\nVALUE: q1.txt".to_string()
            } else {
                "ANSWERS: yes\nVALUE: none".to_string()
            };
            return Ok(text_reply(&reply));
        }
        if user.contains("none of these tools can help") {
            return Ok(text_reply(
                "Here you go:\n1. What is the capital of France?\n2. Write a haiku about autumn leaves",
            ));
        }
        if user.contains("easy to confuse") {
            let needs = between(user, "each of which needs «", "»");
            return Ok(text_reply(if needs == "list_files" {
                "1. Show me what is inside the reports folder"
            } else {
                "1. Print the team roles file in full"
            }));
        }
        let tool = between(user, "Tool «", "»");
        if tool == "calculator" {
            // One request depends on the sampling seed, as a model's would: another seed drafts something new.
            return Ok(text_reply(&format!(
                "1. What is 17 times 23?\n2. Multiply seventeen by twenty-three for me\n3. ok\n\
                 4. What is 17 times 23 for order {}?",
                req.seed.unwrap_or(0) % 1000
            )));
        }
        Ok(text_reply(match tool {
            "read_file" => {
                "1. Who is the treasurer of the study group team?\n2. Open the moon landing notes for me\n\
                 3. What does the recipe say about flour?\n4. Summarise the meeting memo please\n\
                 5. Who is the treasurer of the study group team?\n6. Use read_file on team.txt now"
            }
            "list_files" => "1. Which reports are in the reports folder?",
            _ => "1. Look up the record for key a",
        }))
    }

    fn usage_total(&self) -> Usage {
        Usage::default()
    }
}

fn small_counts() -> Counts {
    Counts {
        per_tool: 6,
        no_tool: 2,
        pairs: 1,
        per_pair: 1,
    }
}

/// Verification keeps exactly the tasks whose call succeeded and whose result answers them, with an answer check
/// from a value found in the result; every other task is dropped with its reason. The suite it writes loads, its
/// reference calls all pass `suite check`, and an answer edited by hand makes `suite check` name the task's line.
#[tokio::test]
async fn scripted_draft_on_week01_keeps_verified_tasks_and_check_finds_a_broken_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("week01-drafted.toml");
    let cfg = config(week01_spec(), out.clone(), small_counts());
    let model = ScriptedFakeDrafter { babble: None };
    let mut stages = Vec::new();
    let o = draft(&cfg, &model, &AtomicBool::new(false), &mut |p| {
        stages.push((p.stage, p.done, p.total))
    })
    .await
    .expect("draft");

    let reason_of = |needle: &str| {
        o.dropped
            .iter()
            .find(|d| d.prompt.contains(needle))
            .map(|d| d.reason)
    };
    assert_eq!(reason_of("moon"), Some(DropReason::ToolError));
    assert_eq!(reason_of("recipe"), Some(DropReason::NotAnswered));
    assert_eq!(reason_of("memo"), Some(DropReason::UnreadableVerdict));
    assert_eq!(reason_of("Use read_file"), Some(DropReason::Malformed));
    assert_eq!(reason_of("treasurer"), Some(DropReason::Duplicate));
    let check_of = |needle: &str| {
        o.kept
            .iter()
            .find(|k| k.prompt.contains(needle))
            .unwrap_or_else(|| panic!("no kept task with {needle:?}: {:?}", o.kept))
            .check
            .clone()
    };
    assert_eq!(
        check_of("17 times 23"),
        TaskCheck::Answer(Check::Number(391.0))
    );
    assert_eq!(
        check_of("treasurer"),
        TaskCheck::Answer(Check::Contains("Joon Lee".into()))
    );
    assert_eq!(
        check_of("Which reports"),
        TaskCheck::Answer(Check::Contains("q1.txt".into()))
    );
    assert!(matches!(
        check_of("capital of France"),
        TaskCheck::Routing(_)
    ));
    let confusable = o
        .kept
        .iter()
        .find(|k| k.prompt.contains("inside the reports folder"))
        .expect("the confusable request");
    assert_eq!(confusable.kind.against(), Some("read_file"));
    assert_eq!(o.drafted(), o.kept.len() + o.dropped.len());
    assert!(
        stages.iter().any(|s| s.0 == "verifying") && stages.last().map(|s| s.0) == Some("writing")
    );
    let last = stages.last().expect("progress");
    assert_eq!(
        last.1, last.2,
        "every unit counted is done at the end: {stages:?}"
    );

    // The file: it loads, the tasks carry provenance and the review pages exist.
    let suite = Suite::load(&out).expect("the drafted suite loads");
    assert_eq!(suite.tasks.len(), o.kept.len());
    assert!(
        suite
            .tasks
            .iter()
            .all(|t| t.provenance.as_ref().is_some_and(|p| p.drafted))
    );
    let france = suite
        .tasks
        .iter()
        .find(|t| t.prompt.contains("France"))
        .expect("no-tool task");
    assert_eq!(france.owner, None);
    assert_eq!(
        france.forbid_tools.len(),
        3,
        "a no-tool task forbids every tool"
    );
    let text = std::fs::read_to_string(&out).expect("read");
    assert!(!text.contains("\"/"), "no absolute path: {text}");
    assert!(text.contains("${TOOLTUNE_BIN_DIR}/week01-tools"), "{text}");
    let html =
        std::fs::read_to_string(dir.path().join("week01-drafted.review.html")).expect("html");
    assert!(html.contains("Dropped") && html.contains("tool-error"));

    // suite check: every reference call passes; then a hand edit breaks one task and its line is named.
    let report = check_suite(&out, Duration::from_secs(10), &mut |_, _| {})
        .await
        .expect("check");
    assert_eq!(report.unsolvable(), 0, "{:?}", report.problems);
    assert_eq!(
        report.checked,
        suite
            .tasks
            .iter()
            .filter(|t| !t.reference.is_empty())
            .count()
    );
    let broken = text.replacen("answer.number = 391", "answer.number = 392", 1);
    assert_ne!(broken, text);
    std::fs::write(&out, &broken).expect("write");
    let report = check_suite(&out, Duration::from_secs(10), &mut |_, _| {})
        .await
        .expect("check");
    let bad: Vec<_> = report
        .problems
        .iter()
        .filter(|p| p.finding == Finding::Unsolvable)
        .collect();
    assert_eq!(bad.len(), 1, "{:?}", report.problems);
    let header_line = broken
        .lines()
        .position(|l| l.contains("answer.number = 392"))
        .expect("edited line");
    let line = bad[0].line.expect("line");
    assert!(
        line <= header_line + 1 && broken.lines().nth(line - 1) == Some("[[task]]"),
        "{}",
        bad[0]
    );
    assert!(bad[0].to_string().contains("392"), "{}", bad[0]);

    // --more with the same seed: the drafter writes the same requests again, every one a repeat; nothing is added
    // and the file stays as it was.
    std::fs::write(&out, &text).expect("restore");
    let mut more = cfg.clone();
    more.more = true;
    let m = draft(&more, &model, &AtomicBool::new(false), &mut |_| {}).await;
    match m {
        Err(DraftError::NothingKept { reasons, .. }) => {
            assert!(reasons.contains("duplicate"), "{reasons}")
        }
        other => panic!("expected nothing new to keep, got {other:?}"),
    }
    assert_eq!(
        std::fs::read_to_string(&out).expect("read"),
        text,
        "the suite is unchanged"
    );
    // Another seed drafts one new request: it is appended after the tasks already there, which stay as written.
    more.seed = 1;
    let m = draft(&more, &model, &AtomicBool::new(false), &mut |_| {})
        .await
        .expect("--more");
    assert_eq!(m.existing, suite.tasks.len());
    assert_eq!(m.kept.len(), 1, "{:?}", m.kept);
    assert!(m.kept[0].prompt.contains("for order"), "{:?}", m.kept[0]);
    let after = std::fs::read_to_string(&out).expect("read");
    assert!(
        after.starts_with(&text),
        "the earlier tasks are kept byte for byte"
    );
    let grown = Suite::load(&out).expect("loads");
    assert_eq!(grown.tasks.len(), suite.tasks.len() + 1);
    // The review pages are rewritten for the whole file: every task, the earlier ones marked so.
    assert_eq!(m.earlier.len(), suite.tasks.len());
    let review = std::fs::read_to_string(&m.review_md).expect("review");
    for t in &grown.tasks {
        assert!(
            review.contains(&format!("**{}**", t.id)),
            "{} missing from the review:\n{review}",
            t.id
        );
    }
    assert_eq!(
        review.matches(", earlier)").count(),
        suite.tasks.len(),
        "{review}"
    );
}

#[tokio::test]
async fn a_server_that_does_not_start_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("s.toml");
    let spec = ServerSpec::stdio("missing", "/nonexistent/tooltune-no-such-server", &[]);
    let e = draft(
        &config(spec, out.clone(), small_counts()),
        &ScriptedFakeDrafter { babble: None },
        &AtomicBool::new(false),
        &mut |_| {},
    )
    .await
    .expect_err("must fail");
    let m = e.to_string();
    assert!(matches!(e, DraftError::ServerStart { .. }), "{m}");
    assert!(
        m.contains("/nonexistent/tooltune-no-such-server") && m.contains("did not start"),
        "{m}"
    );
    assert!(!out.exists());
}

#[tokio::test]
async fn a_server_without_tools_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("s.toml");
    let e = draft(
        &config(bare_spec(&["--no-tools"]), out.clone(), small_counts()),
        &ScriptedFakeDrafter { babble: None },
        &AtomicBool::new(false),
        &mut |_| {},
    )
    .await
    .expect_err("must fail");
    assert!(matches!(e, DraftError::NoTools { .. }), "{e}");
    assert!(e.to_string().contains("lists no tools"), "{e}");
    assert!(!out.exists());
}

#[tokio::test]
async fn a_model_that_writes_no_list_is_named_with_its_reply() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("s.toml");
    let model = ScriptedFakeDrafter {
        babble: Some("As an AI model I would rather not."),
    };
    let e = draft(
        &config(week01_spec(), out.clone(), small_counts()),
        &model,
        &AtomicBool::new(false),
        &mut |_| {},
    )
    .await
    .expect_err("must fail");
    assert!(matches!(e, DraftError::NothingParseable { .. }), "{e}");
    assert!(e.to_string().contains("As an AI model"), "{e}");
    assert!(!out.exists());
}

#[tokio::test]
async fn reference_calls_that_time_out_are_dropped_and_nothing_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("s.toml");
    let mut cfg = config(bare_spec(&["--slow", "3"]), out.clone(), small_counts());
    cfg.call_timeout = Duration::from_millis(500);
    cfg.counts.no_tool = 0;
    let e = draft(
        &cfg,
        &ScriptedFakeDrafter { babble: None },
        &AtomicBool::new(false),
        &mut |_| {},
    )
    .await
    .expect_err("must fail");
    let m = e.to_string();
    assert!(matches!(e, DraftError::NothingKept { .. }), "{m}");
    assert!(m.contains("timeout") && m.contains("--call-timeout"), "{m}");
    assert!(!out.exists(), "no suite is written");
    assert!(
        dir.path().join("s.review.md").exists(),
        "the review page says why"
    );
}

/// The whole path with the real embedded model, the default drafter (1.5B; the 0.5B copied the prompt's example
/// and kept no tool task): it drafts, verifies on the real server, and what it keeps is a suite that loads and whose
/// every reference call passes `suite check`.
#[tokio::test]
async fn the_embedded_model_drafts_a_suite_that_checks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("week01-local.toml");
    let model =
        tooltune_llm::build(&tooltune_llm::BackendSpec::parse("local", None).expect("spec"))
            .await
            .expect("the local model loads (fetched on first use)");
    let counts = Counts {
        per_tool: 2,
        no_tool: 1,
        pairs: 0,
        per_pair: 0,
    };
    let cfg = config(week01_spec(), out.clone(), counts);
    let o = draft(&cfg, model.as_ref(), &AtomicBool::new(false), &mut |_| {})
        .await
        .expect("draft with the 1.5B");
    assert!(
        o.kept.iter().any(|k| k.owner.is_some()),
        "at least one verified tool task: {:?}",
        o.dropped
    );
    assert_eq!(o.drafted(), o.kept.len() + o.dropped.len());
    let suite = Suite::load(&out).expect("loads");
    assert_eq!(suite.tasks.len(), o.kept.len());
    let report = check_suite(&out, Duration::from_secs(10), &mut |_, _| {})
        .await
        .expect("check");
    assert_eq!(report.unsolvable(), 0, "{:?}", report.problems);
    let summary: Value = o.summary();
    assert_eq!(summary["kept"], json!(o.kept.len()));
}

/// Ctrl-C during verification (the stop flag, set here after the first verified batch) keeps what was verified: the
/// suite is written with those tasks and loads, and the rest are listed as stopped.
#[tokio::test]
async fn a_stop_keeps_what_was_verified() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("stopped.toml");
    let cfg = config(week01_spec(), out.clone(), small_counts());
    let stop = AtomicBool::new(false);
    let mut verifying = 0;
    let o = draft(
        &cfg,
        &ScriptedFakeDrafter { babble: None },
        &stop,
        &mut |p| {
            if p.stage == "verifying" {
                verifying += 1;
                if verifying == 2 {
                    stop.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            }
        },
    )
    .await
    .expect("what was verified is written");
    assert!(o.stopped);
    assert!(
        !o.kept.is_empty() && o.kept.len() <= 4,
        "one batch: {:?}",
        o.kept
    );
    assert!(o.dropped.iter().any(|d| d.reason == DropReason::Stopped));
    assert_eq!(Suite::load(&out).expect("loads").tasks.len(), o.kept.len());
    // Written through a temporary file, but readable like any file a person writes.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&out)
            .expect("metadata")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o644);
    }
}

/// With `--fixture` the server runs on a copy named by `${FIXTURE_DIR}`: drafting works on the copy, and the suite
/// names the fixture (relative to the suite) and starts its server on each rollout's copy, so it loads and checks.
#[tokio::test]
async fn a_fixture_server_runs_on_copies_and_the_suite_names_the_fixture() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("fx.toml");
    let spec = ServerSpec::stdio(
        "week01-tools",
        week01_bin().to_string_lossy(),
        &["--data", "${FIXTURE_DIR}", "--with-list-files"],
    );
    let mut cfg = config(spec, out.clone(), small_counts());
    cfg.fixture = Some(workspace().join("datasets/week01-tools/data"));
    let o = draft(
        &cfg,
        &ScriptedFakeDrafter { babble: None },
        &AtomicBool::new(false),
        &mut |_| {},
    )
    .await
    .expect("draft on a fixture");
    assert!(o.kept.iter().any(|k| k.owner.is_some()), "{:?}", o.dropped);
    let text = std::fs::read_to_string(&out).expect("read");
    assert!(text.contains("[fixture]\npath = \""), "{text}");
    assert!(text.contains("cwd = \"${FIXTURE_DIR}\""), "{text}");
    let suite = Suite::load(&out).expect("loads");
    assert!(suite.fixture.is_some());
    let report = check_suite(&out, Duration::from_secs(10), &mut |_, _| {})
        .await
        .expect("check");
    assert_eq!(report.unsolvable(), 0, "{:?}", report.problems);
    // Without the fixture the same command is refused before anything starts.
    let mut bad = cfg.clone();
    bad.fixture = None;
    let e = draft(
        &bad,
        &ScriptedFakeDrafter { babble: None },
        &AtomicBool::new(false),
        &mut |_| {},
    )
    .await
    .expect_err("no fixture");
    assert!(matches!(e, DraftError::FixtureMissing), "{e}");
}

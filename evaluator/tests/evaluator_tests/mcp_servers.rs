//! The MCP client against our own example servers: both transports, the 2026-07-28 era and the legacy
//! handshake, the lab's third tool, read_file confinement, a killed server, timeouts, the pool, the
//! cleared environment, and tools/call latency.

use crate::common;

use common::{CALL, HttpServer, median_p99, server_bin, week01_data};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tooltune_evaluator::{EvalError, McpServer, ProtocolPref, ServerPool, ServerSpec, Transport};

fn week01_spec(extra: &[&str]) -> ServerSpec {
    let data = week01_data();
    let mut args = vec!["--data", data.to_str().expect("utf8 path")];
    args.extend_from_slice(extra);
    ServerSpec::stdio("week01-tools", server_bin("week01-tools"), &args)
}

fn names(tools: &[tooltune_core::ToolSpec]) -> Vec<String> {
    let mut v: Vec<String> = tools.iter().map(|t| t.name.clone()).collect();
    v.sort();
    v
}

fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // A zombie has exited; it only waits to be reaped.
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

#[tokio::test]
async fn stdio_speaks_2026_07_28_and_lists_the_lab_tools() {
    let server = McpServer::connect(week01_spec(&[])).await.expect("connect");
    assert_eq!(server.negotiated_protocol().as_deref(), Some("2026-07-28"));
    let tools = server.list_tools().await.expect("tools/list");
    assert_eq!(names(&tools), vec!["calculator", "read_file"]);
    let calc = tools
        .iter()
        .find(|t| t.name == "calculator")
        .expect("calculator");
    assert_eq!(
        calc.description,
        "Evaluate an arithmetic expression such as '3 * (4 + 5)'. Numbers and + - * / ** only."
    );
    assert_eq!(
        calc.input_schema["properties"]["expression"]["type"],
        "string"
    );

    let r = server
        .call_tool(
            "calculator",
            json!({"expression": "48000 + 9500 + 12000 + 4"}),
            CALL,
        )
        .await
        .expect("call");
    assert_eq!((r.content_text.as_str(), r.is_error), ("69504", false));
    let notes = server
        .call_tool("read_file", json!({"path": "notes.txt"}), CALL)
        .await
        .expect("call");
    // The lecture's notes.txt, byte for byte (its reference run logs it).
    assert_eq!(
        notes.content_text,
        "Meeting memo, 2026-09-01\n\
         Attendees: 4 / Pizza budget: 48000 / Drinks: 9500 / Reimbursed so far: 12000\n\
         Sum the numbers above to get the total the agent should report.\n"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn calculator_refuses_everything_but_arithmetic() {
    let server = McpServer::connect(week01_spec(&[])).await.expect("connect");
    for (expr, needle) in [
        ("1 / 0", "division by zero"),
        ("__import__('os').system('id')", "unexpected character"),
        ("2 % 3", "unexpected character '%'"),
        ("48,000 + 1", "thousands separators"),
        ("(1 + 2", "never closed"),
    ] {
        let r = server
            .call_tool("calculator", json!({ "expression": expr }), CALL)
            .await
            .expect("call");
        assert!(r.is_error, "{expr} should be an isError result: {r:?}");
        assert!(
            r.content_text.contains(needle),
            "{expr}: {}",
            r.content_text
        );
    }
    // Missing arguments are the model's mistake, reported as a tool error it can read.
    let r = server
        .call_tool("calculator", json!({}), CALL)
        .await
        .expect("call");
    assert!(r.is_error && r.content_text.contains("expression"), "{r:?}");
    // An unknown tool is refused by the protocol: not infrastructure.
    let e = server
        .call_tool("no_such_tool", json!({}), CALL)
        .await
        .expect_err("unknown tool");
    assert!(matches!(e, EvalError::ToolRejected { .. }), "{e}");
    assert!(!e.is_infrastructure());
}

#[tokio::test]
async fn read_file_escape_attempts_are_refused() {
    let outer = tempfile::tempdir().expect("tempdir");
    let data = outer.path().join("data");
    std::fs::create_dir(&data).expect("mkdir");
    std::fs::write(data.join("notes.txt"), "Attendees: 4\n").expect("write");
    let secret = outer.path().join("secret.txt");
    std::fs::write(&secret, "the secret").expect("write");
    std::os::unix::fs::symlink(&secret, data.join("link.txt")).expect("symlink");
    std::os::unix::fs::symlink(outer.path(), data.join("up")).expect("symlink");
    let spec = ServerSpec::stdio(
        "week01-tools",
        server_bin("week01-tools"),
        &["--data", data.to_str().expect("utf8"), "--with-list-files"],
    );
    let server = McpServer::connect(spec).await.expect("connect");
    let ok = server
        .call_tool("read_file", json!({"path": "notes.txt"}), CALL)
        .await
        .expect("call");
    assert!(
        !ok.is_error && ok.content_text == "Attendees: 4\n",
        "{ok:?}"
    );
    let abs = secret.to_str().expect("utf8").to_string();
    for (path, needle) in [
        ("../secret.txt", "'..'"),
        ("./../data/notes.txt", "'..'"),
        (abs.as_str(), "absolute"),
        ("/etc/passwd", "absolute"),
        ("link.txt", "outside"),
        ("up/secret.txt", "outside"),
    ] {
        let r = server
            .call_tool("read_file", json!({ "path": path }), CALL)
            .await
            .expect("call");
        assert!(r.is_error, "{path} was not refused: {r:?}");
        assert!(
            r.content_text.contains(needle),
            "{path}: {}",
            r.content_text
        );
        assert!(
            !r.content_text.contains("the secret"),
            "{path} leaked: {r:?}"
        );
    }
    let listing = server
        .call_tool("list_files", json!({}), CALL)
        .await
        .expect("call");
    assert!(!listing.content_text.contains("link.txt"), "{listing:?}");
    let up = server
        .call_tool("list_files", json!({"path": "up"}), CALL)
        .await
        .expect("call");
    assert!(up.is_error && up.content_text.contains("outside"), "{up:?}");
}

#[tokio::test]
async fn a_third_tool_added_on_the_server_only_appears_in_tools_list() {
    let without = McpServer::connect(week01_spec(&[])).await.expect("connect");
    assert_eq!(
        names(&without.list_tools().await.expect("list")),
        vec!["calculator", "read_file"]
    );
    let with = McpServer::connect(week01_spec(&["--with-list-files"]))
        .await
        .expect("connect");
    let tools = with.list_tools().await.expect("list");
    assert_eq!(names(&tools), vec!["calculator", "list_files", "read_file"]);
    let r = with
        .call_tool("list_files", json!({"path": "reports"}), CALL)
        .await
        .expect("call");
    assert!(
        r.content_text.contains("q1.txt") && r.content_text.contains("q2.txt"),
        "{r:?}"
    );

    // The same switch through the suite-style environment of a cleared-env child.
    let mut spec = week01_spec(&[]);
    if let Transport::Stdio { env, .. } = &mut spec.transport {
        env.insert("WEEK01_LIST_FILES".into(), "1".into());
    }
    let via_env = McpServer::connect(spec).await.expect("connect");
    assert_eq!(names(&via_env.list_tools().await.expect("list")).len(), 3);
}

#[tokio::test]
async fn streamable_http_gives_the_same_tools_in_both_eras() {
    let data = week01_data();
    let http = HttpServer::start(
        &server_bin("week01-tools"),
        &["--data", data.to_str().expect("utf8")],
    );
    let modern = McpServer::connect(ServerSpec::http("week01-http", &http.url))
        .await
        .expect("connect over HTTP");
    assert_eq!(modern.negotiated_protocol().as_deref(), Some("2026-07-28"));
    let stdio = McpServer::connect(week01_spec(&[])).await.expect("connect");
    assert_eq!(
        modern.list_tools().await.expect("list"),
        stdio.list_tools().await.expect("list")
    );
    let r = modern
        .call_tool("calculator", json!({"expression": "3 * (4 + 5)"}), CALL)
        .await
        .expect("call");
    assert_eq!(r.content_text, "27");

    // The legacy initialize handshake against the same endpoint.
    let legacy = McpServer::connect(
        ServerSpec::http("week01-http-legacy", &http.url)
            .with_protocol(ProtocolPref::Version("2025-11-25".into())),
    )
    .await
    .expect("legacy connect over HTTP");
    assert_eq!(legacy.negotiated_protocol().as_deref(), Some("2025-11-25"));
    let r = legacy
        .call_tool("read_file", json!({"path": "notes.txt"}), CALL)
        .await
        .expect("call");
    assert!(r.content_text.contains("Pizza budget: 48000"), "{r:?}");
}

#[tokio::test]
async fn missing_bearer_token_variable_is_named_not_shown() {
    let spec = ServerSpec {
        transport: Transport::Http {
            url: "http://127.0.0.1:9/mcp".into(),
            bearer_token_env: Some("TOOLTUNE_TEST_TOKEN_THAT_IS_NOT_SET".into()),
        },
        ..ServerSpec::http("x", "http://127.0.0.1:9/mcp")
    };
    let e = McpServer::connect(spec).await.expect_err("no token");
    assert!(matches!(e, EvalError::MissingEnv { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("TOOLTUNE_TEST_TOKEN_THAT_IS_NOT_SET"),
        "{e}"
    );
}

#[tokio::test]
async fn a_server_killed_mid_use_is_detected_and_restarted() {
    let server = std::sync::Arc::new(McpServer::connect(week01_spec(&[])).await.expect("connect"));
    let pid = server.pid().await.expect("child pid");
    // Calls keep running while the process is killed under them.
    let runner = {
        let server = server.clone();
        tokio::spawn(async move {
            for i in 0..100_000u32 {
                let r = server
                    .call_tool(
                        "calculator",
                        json!({"expression": format!("{i} + 1")}),
                        CALL,
                    )
                    .await;
                if let Err(e) = r {
                    return (i, e);
                }
            }
            panic!("the server was never seen dying");
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    signal("-KILL", pid);
    let (calls_before, err) = runner.await.expect("runner");
    assert!(calls_before > 0, "no call succeeded before the kill");
    assert!(err.is_infrastructure(), "{err}");
    assert!(matches!(err, EvalError::ServerDied { .. }), "{err}");
    assert!(!server.is_alive().await);
    // Still dead until someone restarts it: a call never restarts behind the caller's back.
    let again = server
        .call_tool("calculator", json!({"expression": "1"}), CALL)
        .await
        .expect_err("dead");
    assert!(matches!(again, EvalError::ServerDied { .. }), "{again}");

    server.ensure_connected().await.expect("restart");
    assert_eq!(server.restarts(), 1);
    let new_pid = server.pid().await.expect("pid");
    assert_ne!(new_pid, pid);
    let r = server
        .call_tool("calculator", json!({"expression": "2 ** 10"}), CALL)
        .await
        .expect("call after restart");
    assert_eq!(r.content_text, "1024");
    server.shutdown().await;
    assert!(
        process_gone(new_pid),
        "shutdown left process {new_pid} running"
    );
}

fn signal(sig: &str, pid: u32) {
    let status = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill {sig} {pid} failed");
}

#[tokio::test]
async fn a_hung_server_times_out_as_infrastructure_and_recovers() {
    let server = McpServer::connect(week01_spec(&[])).await.expect("connect");
    let pid = server.pid().await.expect("pid");
    // A stopped process is a server that hangs: it neither answers nor closes the pipe.
    signal("-STOP", pid);
    let e = server
        .call_tool(
            "calculator",
            json!({"expression": "1 + 1"}),
            Duration::from_millis(300),
        )
        .await
        .expect_err("a stopped server cannot answer");
    signal("-CONT", pid);
    assert!(
        matches!(e, EvalError::Timeout { .. }) && e.is_infrastructure(),
        "{e}"
    );
    assert!(server.is_alive().await);
    let r = server
        .call_tool("calculator", json!({"expression": "1 + 1"}), CALL)
        .await
        .expect("call after the server resumed");
    assert_eq!(r.content_text, "2");
}

#[tokio::test]
async fn dropping_the_handle_kills_the_child() {
    let server = McpServer::connect(week01_spec(&[])).await.expect("connect");
    let pid = server.pid().await.expect("pid");
    drop(server);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !process_gone(pid) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(process_gone(pid), "process {pid} outlived its handle");
}

#[tokio::test]
async fn the_pool_keeps_one_process_per_server_and_remembers_the_protocol() {
    let pool = ServerPool::new();
    let spec = week01_spec(&[]);
    let a = pool.get(&spec).await.expect("first");
    let b = pool.get(&spec).await.expect("second");
    assert!(std::sync::Arc::ptr_eq(&a, &b));
    assert_eq!(a.pid().await, b.pid().await);
    let choices = pool.protocol_choices().await;
    assert_eq!(
        choices.get(&spec.key()).map(String::as_str),
        Some("2026-07-28")
    );

    // A pool seeded with the persisted choice goes straight to discover.
    let seeded = ServerPool::with_protocol_choices(choices);
    let c = seeded.get(&spec).await.expect("seeded");
    assert_eq!(
        c.spec().protocol,
        ProtocolPref::Version("2026-07-28".into())
    );
    pool.shutdown().await;
    seeded.shutdown().await;
}

#[tokio::test]
async fn children_start_with_only_the_suite_environment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("env.txt");
    let mut env = BTreeMap::new();
    env.insert("OUT".to_string(), out.to_string_lossy().into_owned());
    env.insert("SUITE_VALUE".to_string(), "42".to_string());
    // Not an MCP server: it records its environment and exits, so the handshake fails.
    let spec = ServerSpec {
        transport: Transport::Stdio {
            command: "sh".into(),
            args: vec!["-c".into(), "env > \"$OUT\"".into()],
            env,
            pass_env: vec![],
            cwd: Some(dir.path().to_path_buf()),
        },
        connect_timeout: Duration::from_secs(5),
        ..ServerSpec::stdio("env-probe", "sh", &[])
    };
    let e = McpServer::connect(spec).await.expect_err("not a server");
    assert!(e.is_infrastructure(), "{e}");
    let recorded = std::fs::read_to_string(&out).expect("env recorded");
    let names: Vec<&str> = recorded
        .lines()
        .filter_map(|l| l.split('=').next())
        .collect();
    assert!(names.contains(&"SUITE_VALUE"), "{recorded}");
    for leaked in ["HOME", "PATH", "USER", "CARGO", "CARGO_MANIFEST_DIR"] {
        assert!(
            !names.contains(&leaked),
            "{leaked} leaked into the child: {recorded}"
        );
    }
}

#[tokio::test]
async fn tools_call_round_trip_latency() {
    const N: usize = 1000;
    async fn measure(server: &McpServer) -> Vec<Duration> {
        let mut v = Vec::with_capacity(N);
        for i in 0..N {
            let started = Instant::now();
            let r = server
                .call_tool(
                    "calculator",
                    json!({"expression": format!("{i} * 2")}),
                    CALL,
                )
                .await
                .expect("call");
            v.push(started.elapsed());
            assert_eq!(r.content_text, (i * 2).to_string());
        }
        v
    }
    let stdio = McpServer::connect(week01_spec(&[])).await.expect("connect");
    let (s50, s99) = median_p99(measure(&stdio).await);
    let data = week01_data();
    let http = HttpServer::start(
        &server_bin("week01-tools"),
        &["--data", data.to_str().expect("utf8")],
    );
    let server = McpServer::connect(ServerSpec::http("week01-http", &http.url))
        .await
        .expect("connect");
    let (h50, h99) = median_p99(measure(&server).await);
    println!(
        "tools/call round trip over {N} calls: stdio median {s50:.3} ms p99 {s99:.3} ms; \
         Streamable HTTP median {h50:.3} ms p99 {h99:.3} ms"
    );
    // Far below a model turn (seconds); a regression to per-call process start or connection set-up
    // (tens to hundreds of ms) fails here.
    assert!(s50 < 5.0 && h50 < 10.0, "stdio {s50} ms, http {h50} ms");
}

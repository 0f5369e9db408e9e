//! `tooltune proxy` end to end: protocol fidelity with the official Python SDK's client against npm
//! `server-everything` and our contractor server (stdio and Streamable HTTP) and with rmcp's client against the
//! contractor (both transports, both lifecycles), the start-up check of tool names over both transports, a server
//! that dies mid-session, and A/B variants separated by `traces stats --by variant`.
//! Needs `scripts/setup` (the Python SDK comes with the time server's virtualenv, server-everything with the
//! node servers).

use serde_json::{Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cli has a parent")
        .to_path_buf()
}

fn tooltune() -> &'static str {
    env!("CARGO_BIN_EXE_tooltune")
}

/// The contractor server, built beside the binary under test.
fn contractor() -> Vec<String> {
    let exe = PathBuf::from(tooltune());
    let dir = exe.parent().expect("bin dir").to_path_buf();
    let mut cmd = Command::new(env!("CARGO"));
    cmd.current_dir(workspace())
        .args(["build", "-q", "-p", "contractor"]);
    if dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    assert!(
        cmd.status().expect("cargo").success(),
        "building contractor"
    );
    vec![
        dir.join("contractor").display().to_string(),
        "--data".into(),
        workspace()
            .join("datasets/contractor/data")
            .display()
            .to_string(),
    ]
}

fn third_party() -> PathBuf {
    std::env::var_os("TOOLTUNE_THIRD_PARTY")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("datasets/.third-party"))
}

fn python_sdk() -> PathBuf {
    let p = third_party().join("time/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run scripts/setup (it installs the Python MCP SDK with the time server)",
        p.display()
    );
    p
}

fn everything() -> Vec<String> {
    let entry = third_party()
        .join("node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        entry.exists(),
        "{} is missing: run scripts/setup",
        entry.display()
    );
    vec!["node".into(), entry.display().to_string(), "stdio".into()]
}

fn write(dir: &Path, name: &str, v: &Value) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, v.to_string()).expect("write");
    p
}

fn fidelity(server: &[String], overrides: Value) -> Value {
    let dir = tempfile::tempdir().expect("tempdir");
    let ov = write(dir.path(), "ov.json", &overrides);
    let db = dir.path().join("t.db");
    let out = Command::new(python_sdk())
        .arg(workspace().join("proxy/tests/fidelity.py"))
        .arg(tooltune())
        .arg(&db)
        .arg(&ov)
        .arg("--")
        .args(server)
        .env("TOOLTUNE_LOG", "error")
        .output()
        .expect("python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "fidelity check failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("report")
}

#[test]
fn the_python_sdk_gets_the_same_answers_through_the_proxy_except_rewritten_descriptions() {
    let r = fidelity(
        &everything(),
        json!({"echo": "Repeats the message back, unchanged."}),
    );
    assert_eq!(r["differences"], json!([]));
    assert_eq!(r["rewritten"], json!(["echo"]));
    // Server-to-client requests and notifications crossed the proxy: sampling was answered, progress arrived.
    assert_eq!(r["sampling_requests"], 1);
    assert_eq!(r["progress"].as_array().map(Vec::len), Some(3));
    for k in [
        "initialize",
        "tools",
        "echo",
        "sum",
        "unknown_tool",
        "resources",
        "read",
        "prompts",
        "prompt",
    ] {
        assert!(
            r["compared"].as_array().expect("list").contains(&json!(k)),
            "{k} not compared: {r}"
        );
    }
}

/// One raw stdio session through the proxy: sends `lines`, returns every line the host received.
fn session(db: &Path, proxy_args: &[&str], server: &[String], lines: &[Value]) -> Vec<Value> {
    let mut child = Command::new(tooltune())
        .arg("--database-url")
        .arg(db)
        .arg("proxy")
        .args(proxy_args)
        .arg("--")
        .args(server)
        .env("TOOLTUNE_LOG", "error")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("proxy");
    let mut stdin = child.stdin.take().expect("stdin");
    for l in lines {
        writeln!(stdin, "{l}").expect("send");
    }
    // Give the server time to answer before the host hangs up (the proxy then stops the server).
    std::thread::sleep(std::time::Duration::from_millis(700));
    drop(stdin);
    let out = child.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "proxy failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("host got non-JSON {l:?}: {e}")))
        .collect()
}

fn init() -> Value {
    json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"test","version":"1"}}})
}

#[test]
fn our_rmcp_server_answers_the_same_through_the_proxy_and_names_a_missing_tool_at_start() {
    let r = fidelity(
        &contractor(),
        json!({"search_docs": "Search Quillmark's internal engineering documentation."}),
    );
    // The contractor has no echo: the script's calls to tools it lacks must fail the same way on both paths.
    assert_eq!(r["differences"], json!([]));
    assert_eq!(r["rewritten"], json!(["search_docs"]));

    let dir = tempfile::tempdir().expect("tempdir");
    let ov = write(dir.path(), "ov.json", &json!({"serch_docs": "typo"}));
    let out = Command::new(tooltune())
        .arg("--database-url")
        .arg(dir.path().join("t.db"))
        .args(["proxy", "--overrides"])
        .arg(&ov)
        .arg("--")
        .args(contractor())
        .stdin(Stdio::null())
        .output()
        .expect("proxy");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("has no tool serch_docs") && err.contains("search_docs, web_search"),
        "{err}"
    );
}

#[test]
fn a_server_that_dies_gets_its_requests_failed_and_the_proxy_keeps_answering_the_host() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A server that answers initialize and exits.
    let server: Vec<String> = vec![
        "sh".into(),
        "-c".into(),
        r#"read l; echo '{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-06-18","capabilities":{},"serverInfo":{"name":"x","version":"0"}}}'; exit 3"#.into(),
    ];
    let got = session(
        &dir.path().join("t.db"),
        &["--no-check"],
        &server,
        &[
            init(),
            json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
        ],
    );
    assert_eq!(got.len(), 1, "{got:?}");
    // Now a session whose requests come after the server is gone: each gets an error, and garbage gets -32700.
    let mut child = Command::new(tooltune())
        .arg("--database-url")
        .arg(dir.path().join("t.db"))
        .args(["proxy", "--no-check", "--"])
        .args(&server)
        .env("TOOLTUNE_LOG", "error")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("proxy");
    let mut stdin = child.stdin.take().expect("stdin");
    writeln!(stdin, "{}", init()).expect("send");
    std::thread::sleep(std::time::Duration::from_millis(500));
    for id in 1..=2 {
        writeln!(
            stdin,
            "{}",
            json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":"a","arguments":{}}})
        )
        .expect("send");
    }
    writeln!(stdin, "not json").expect("send");
    std::thread::sleep(std::time::Duration::from_millis(300));
    drop(stdin);
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success());
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    let errors: Vec<(Value, i64)> = lines
        .iter()
        .filter_map(|l| Some((l["id"].clone(), l["error"]["code"].as_i64()?)))
        .collect();
    assert!(errors.contains(&(json!(1), -32603)), "{lines:?}");
    assert!(errors.contains(&(json!(2), -32603)), "{lines:?}");
    assert!(errors.contains(&(Value::Null, -32700)), "{lines:?}");
}

#[test]
fn variants_are_assigned_by_session_key_recorded_and_separated_by_stats() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("t.db");
    let b_text = "Search Quillmark's internal engineering documentation.";
    let b = write(dir.path(), "b.json", &json!({"search_docs": b_text}));
    let variant_b = format!("b={}", b.display());
    let server = contractor();
    let mut shown_by_variant: Vec<(String, String)> = Vec::new();
    for k in 0..8 {
        let key = format!("key-{k}");
        let got = session(
            &db,
            &[
                "--variant",
                "a=-",
                "--variant",
                &variant_b,
                "--session-key",
                &key,
                "--redact",
                "query",
            ],
            &server,
            &[
                init(),
                json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
                json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}),
            ],
        );
        let listing = got
            .iter()
            .find(|l| l["id"] == 1)
            .expect("tools/list answered");
        let text = listing["result"]["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .find(|t| t["name"] == "search_docs")
            .expect("search_docs")["description"]
            .as_str()
            .expect("text")
            .to_string();
        shown_by_variant.push((key, text));
    }
    // The same key gets the same variant again.
    let again = session(
        &db,
        &[
            "--variant",
            "a=-",
            "--variant",
            &variant_b,
            "--session-key",
            "key-0",
        ],
        &server,
        &[
            init(),
            json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}),
        ],
    );
    let text0 =
        again.iter().find(|l| l["id"] == 1).expect("listed")["result"]["tools"][0]["description"]
            .clone();
    assert_eq!(text0.as_str(), Some(shown_by_variant[0].1.as_str()));
    let n_b = shown_by_variant.iter().filter(|(_, t)| t == b_text).count();
    assert!(
        n_b > 0 && n_b < 8,
        "all 8 sessions got one variant: {shown_by_variant:?}"
    );

    // A call per session, then the stats.
    for (key, _) in &shown_by_variant {
        session(
            &db,
            &[
                "--variant",
                "a=-",
                "--variant",
                &variant_b,
                "--session-key",
                key,
                "--redact",
                "query",
            ],
            &server,
            &[
                init(),
                json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
                json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}),
                json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"search_docs","arguments":{"query":"secret words"}}}),
            ],
        );
    }
    let out = Command::new(tooltune())
        .arg("--database-url")
        .arg(&db)
        .args(["traces", "stats", "--by", "variant", "--json"])
        .output()
        .expect("stats");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    let rows = v["variants"].as_array().expect("rows");
    let row = |variant: &str| {
        rows.iter()
            .find(|r| r["variant"] == variant && r["tool"] == "search_docs")
            .unwrap_or_else(|| panic!("no row for {variant}: {v}"))
    };
    // 17 sessions in all: 8 listings, 1 repeat, 8 with a call; each variant's calls are its own.
    let (a, b) = (row("a"), row("b"));
    assert_eq!(
        a["sessions"].as_u64().unwrap_or(0) + b["sessions"].as_u64().unwrap_or(0),
        17
    );
    assert_eq!(b["calls"].as_u64(), Some(n_b as u64));
    assert_eq!(a["calls"].as_u64(), Some(8 - n_b as u64));
    assert!(b["share_p_vs_first"].as_f64().is_some());
    // Each session recorded the tools it was shown: the text, its version and the hints the server declared
    // (contractor declares both searches read-only).
    let tools: Vec<String> = tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(async {
            use sqlx::Connection;
            let mut c = sqlx::SqliteConnection::connect(&format!("sqlite://{}", db.display()))
                .await
                .expect("open");
            sqlx::query_scalar("SELECT tools FROM proxy_sessions WHERE tools IS NOT NULL")
                .fetch_all(&mut c)
                .await
                .expect("query")
        });
    assert_eq!(tools.len(), 17, "sessions with their tools recorded");
    for t in &tools {
        let t: Value = serde_json::from_str(t).expect("tools JSON");
        for name in ["search_docs", "web_search"] {
            assert_eq!(
                t[name]["annotations"],
                json!({"read_only_hint": true}),
                "{name}: {t}"
            );
            assert!(t[name]["description_id"].is_string(), "{t}");
        }
    }
    // Arguments were redacted before they were stored. SQLite folds its write-ahead log into the database and
    // deletes it when the last connection closes, which may happen while this loop runs: the log is read before
    // the database (so what left it is in the database read after), and a log already gone is skipped.
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(dir.path())
        .expect("dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("t.db"))
        })
        .collect();
    files.sort_by_key(|p| p.extension().is_some_and(|e| e == "db"));
    for path in files {
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => panic!("{}: {e}", path.display()),
        };
        assert!(
            !bytes.windows(12).any(|w| w == b"secret words"),
            "a redacted argument reached {}",
            path.display()
        );
    }
}

#[test]
fn over_streamable_http_the_python_sdk_sees_the_rewritten_text_and_the_same_calls() {
    use std::io::BufRead;
    let server = contractor();
    let mut upstream = Command::new(&server[0])
        .args(&server[1..])
        .args(["--http", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("contractor");
    let mut url = String::new();
    std::io::BufReader::new(upstream.stdout.take().expect("stdout"))
        .read_line(&mut url)
        .expect("url");
    let dir = tempfile::tempdir().expect("tempdir");
    let text = "Search Quillmark's internal engineering documentation.";
    let ov = write(dir.path(), "ov.json", &json!({"search_docs": text}));
    let db = dir.path().join("t.db");
    let mut proxy = Command::new(tooltune())
        .arg("--database-url")
        .arg(&db)
        .args([
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            url.trim(),
            "--overrides",
        ])
        .arg(&ov)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("proxy");
    let mut purl = String::new();
    std::io::BufReader::new(proxy.stdout.take().expect("stdout"))
        .read_line(&mut purl)
        .expect("proxy url");
    let out = Command::new(python_sdk())
        .arg(workspace().join("proxy/tests/fidelity_http.py"))
        .args([url.trim(), purl.trim(), "search_docs"])
        .output()
        .expect("python");
    // Ctrl-C is how the proxy is stopped; it then stores what it recorded.
    let _ = Command::new("kill")
        .args(["-INT", &proxy.id().to_string()])
        .status();
    let _ = proxy.wait();
    let _ = upstream.kill();
    let _ = upstream.wait();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_str(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default(),
    )
    .expect("report");
    assert_eq!(r["proxied"], json!([text]));
    let stats = Command::new(tooltune())
        .arg("--database-url")
        .arg(&db)
        .args(["traces", "stats", "--by", "variant", "--json"])
        .output()
        .expect("stats");
    let v: Value = serde_json::from_slice(&stats.stdout).expect("json");
    assert_eq!(v["variants"][0]["calls"], 1, "{v}");
}

/// Starts a process that prints its URL as the first line of its stdout (the contractor with `--http`, the proxy
/// with `--listen`); `None` when it exits first, with what it wrote to stderr.
fn start_listening(cmd: &mut Command) -> Result<(std::process::Child, String), String> {
    use std::io::{BufRead, Read};
    let mut child = cmd
        .env("TOOLTUNE_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut url = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut url)
        .expect("url");
    if url.starts_with("http://") {
        return Ok((child, url.trim().to_string()));
    }
    let _ = child.wait();
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    Err(err)
}

fn contractor_over_http() -> (std::process::Child, String) {
    let server = contractor();
    start_listening(
        Command::new(&server[0])
            .args(&server[1..])
            .args(["--http", "127.0.0.1:0"]),
    )
    .expect("the contractor serves HTTP")
}

fn stop(mut child: std::process::Child) {
    // Ctrl-C is how the proxy is stopped; it then stores what it recorded.
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

/// Ends an upstream server. Not by Ctrl-C: the contractor leaves SIGINT to its default action, and a process
/// started from a shell without job control (a background job in a script) inherits SIGINT ignored, so a
/// SIGINT there would leave the test waiting forever.
fn kill(mut child: std::process::Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn over_http_a_tool_the_upstream_lacks_is_refused_at_start_unless_no_check() {
    let (upstream, url) = contractor_over_http();
    let dir = tempfile::tempdir().expect("tempdir");
    let ov = write(dir.path(), "ov.json", &json!({"serch_docs": "typo"}));
    let proxy = |extra: &[&str]| {
        start_listening(
            Command::new(tooltune())
                .arg("--database-url")
                .arg(dir.path().join("t.db"))
                .args(["proxy", "--listen", "127.0.0.1:0", "--upstream", &url])
                .args(extra)
                .arg("--overrides")
                .arg(&ov),
        )
    };
    let refused = proxy(&[]);
    let err = match refused {
        Ok((child, purl)) => {
            stop(child);
            panic!("the proxy started at {purl} with a tool the upstream lacks");
        }
        Err(e) => e,
    };
    assert!(
        err.contains("has no tool serch_docs") && err.contains("search_docs, web_search"),
        "{err}"
    );
    // The check is the only thing --no-check skips: the proxy then serves (and warns at the first listing).
    let (child, purl) = proxy(&["--no-check"]).expect("--no-check starts");
    assert!(purl.ends_with("/mcp"), "{purl}");
    stop(child);
    // A dead upstream is a start-up error too, naming the check and how to skip it.
    kill(upstream);
    let err = proxy(&[]).expect_err("a dead upstream refuses the start");
    assert!(
        err.contains("checking the tools of") && err.contains("--no-check"),
        "{err}"
    );
}

/// What an rmcp client sees of the contractor: its tools and the results of a few calls (one to a tool it lacks,
/// whose refusal is compared as text).
async fn rmcp_view<T, E, A>(
    transport: T,
    lifecycle: rmcp::ClientLifecycleMode,
    version: rmcp::model::ProtocolVersion,
) -> (Vec<Value>, Vec<Value>)
where
    T: rmcp::transport::IntoTransport<rmcp::RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    use rmcp::ClientServiceExt;
    use rmcp::model::{CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation};
    let client = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("proxy-test", "1"),
    )
    .with_protocol_version(version);
    let service = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        client.serve_with_lifecycle(transport, lifecycle),
    )
    .await
    .expect("handshake in time")
    .expect("handshake");
    let tools = service
        .peer()
        .list_all_tools()
        .await
        .expect("tools/list")
        .into_iter()
        .map(|t| serde_json::to_value(t).expect("tool"))
        .collect();
    let mut calls = Vec::new();
    for (tool, args) in [
        ("search_docs", json!({"query": "webhook signature header"})),
        ("web_search", json!({"query": "quillmark pricing"})),
        ("search_docs", json!({})),
        ("no_such_tool", json!({})),
    ] {
        let params = CallToolRequestParams::new(tool.to_string())
            .with_arguments(args.as_object().cloned().unwrap_or_default());
        calls.push(match service.peer().call_tool(params).await {
            Ok(r) => serde_json::to_value(r).expect("result"),
            Err(e) => json!({"refused": e.to_string()}),
        });
    }
    let _ = service.cancel().await;
    (tools, calls)
}

#[test]
fn the_rmcp_client_sees_the_rewritten_description_and_identical_results_through_the_proxy() {
    use rmcp::ClientLifecycleMode;
    use rmcp::model::ProtocolVersion;
    use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
    let server = contractor();
    let dir = tempfile::tempdir().expect("tempdir");
    let text = "Search Quillmark's internal engineering documentation.";
    let ov = write(dir.path(), "ov.json", &json!({"search_docs": text}));
    let db = dir.path().join("t.db");
    let (upstream, url) = contractor_over_http();
    let (http_proxy, purl) = start_listening(
        Command::new(tooltune())
            .arg("--database-url")
            .arg(dir.path().join("http.db"))
            .args([
                "proxy",
                "--listen",
                "127.0.0.1:0",
                "--upstream",
                &url,
                "--overrides",
            ])
            .arg(&ov),
    )
    .expect("the HTTP proxy starts");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    // Both lifecycles rmcp speaks: initialize (2025-11-25), and server/discover without initialize (2026-07-28).
    let lifecycles = [
        (
            ClientLifecycleMode::Initialize,
            ProtocolVersion::LATEST_WITH_INITIALIZE,
        ),
        (
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
            ProtocolVersion::V_2026_07_28,
        ),
    ];
    let mut compared = 0;
    for (lifecycle, version) in lifecycles {
        let child = |proxied: bool| {
            let mut cmd = if proxied {
                let mut c = tokio::process::Command::new(tooltune());
                c.arg("--database-url")
                    .arg(&db)
                    .args(["proxy", "--overrides"])
                    .arg(&ov)
                    .arg("--")
                    .args(&server);
                c
            } else {
                let mut c = tokio::process::Command::new(&server[0]);
                c.args(&server[1..]);
                c
            };
            cmd.env("TOOLTUNE_LOG", "error");
            TokioChildProcess::new(cmd).expect("spawn")
        };
        let views = rt.block_on(async {
            [
                (
                    "stdio, direct",
                    rmcp_view(child(false), lifecycle.clone(), version.clone()).await,
                ),
                (
                    "stdio, proxied",
                    rmcp_view(child(true), lifecycle.clone(), version.clone()).await,
                ),
                (
                    "HTTP, direct",
                    rmcp_view(
                        StreamableHttpClientTransport::from_uri(url.clone()),
                        lifecycle.clone(),
                        version.clone(),
                    )
                    .await,
                ),
                (
                    "HTTP, proxied",
                    rmcp_view(
                        StreamableHttpClientTransport::from_uri(purl.clone()),
                        lifecycle.clone(),
                        version.clone(),
                    )
                    .await,
                ),
            ]
        });
        for pair in views.chunks(2) {
            let [(_, (direct_tools, direct_calls)), (what, (tools, calls))] = pair else {
                unreachable!("views come in pairs");
            };
            assert_eq!(direct_tools.len(), 2, "{direct_tools:?}");
            // The proxied listing is the direct one with search_docs's description replaced, nothing else.
            let mut expected = direct_tools.clone();
            for t in &mut expected {
                if t["name"] == "search_docs" {
                    assert_ne!(t["description"], json!(text));
                    t["description"] = json!(text);
                }
            }
            assert_eq!(tools, &expected, "{what} ({version:?}): tools differ");
            assert_eq!(
                calls, direct_calls,
                "{what} ({version:?}): call results differ"
            );
            assert!(
                calls[3].get("refused").is_some() || calls[3]["isError"] == json!(true),
                "{what}: a call to a missing tool succeeded: {}",
                calls[3]
            );
            compared += 1;
        }
    }
    stop(http_proxy);
    kill(upstream);
    assert_eq!(compared, 4);
}

//! The MCP client against real third-party servers installed by datasets/setup.sh: PyPI
//! `mcp-server-time` (speaks 2026-07-28) and npm `@modelcontextprotocol/server-filesystem` (stops at
//! 2025-11-25, so the client must fall back to the initialize handshake and remember that).

use crate::common;

use common::{CALL, suites_dir, third_party};
use serde_json::json;
use std::time::Instant;
use tooltune_evaluator::{EvalError, McpServer, ProtocolPref, Suite};

fn load(name: &str) -> Suite {
    third_party();
    Suite::load(suites_dir().join(name)).unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn mcp_server_time_speaks_2026_07_28() {
    let suite = load("mcp-server-time.toml");
    assert_eq!(suite.server.protocol, ProtocolPref::Auto);
    let started = Instant::now();
    let server = McpServer::connect(suite.server.clone())
        .await
        .expect("connect");
    let connect = started.elapsed();
    assert_eq!(server.negotiated_protocol().as_deref(), Some("2026-07-28"));
    let mut names: Vec<String> = server
        .list_tools()
        .await
        .expect("list")
        .into_iter()
        .map(|t| t.name)
        .collect();
    names.sort();
    assert_eq!(names, vec!["convert_time", "get_current_time"]);
    let r = server
        .call_tool(
            "convert_time",
            json!({"source_timezone": "Asia/Tokyo", "time": "09:00", "target_timezone": "Asia/Kolkata"}),
            CALL,
        )
        .await
        .expect("call");
    assert!(
        !r.is_error && r.content_text.contains("T05:30:00+05:30"),
        "{r:?}"
    );
    // A bad zone is the tool's error, not infrastructure.
    let bad = server
        .call_tool(
            "get_current_time",
            json!({"timezone": "Mars/Olympus"}),
            CALL,
        )
        .await;
    match bad {
        Ok(r) => assert!(r.is_error, "{r:?}"),
        Err(e) => assert!(!e.is_infrastructure(), "{e}"),
    }
    println!("mcp-server-time: start + discover {connect:?}");
}

#[tokio::test]
async fn server_filesystem_falls_back_to_initialize_and_remembers_it() {
    let suite = load("server-filesystem.toml");
    assert_eq!(suite.server.protocol, ProtocolPref::Auto);
    let started = Instant::now();
    let server = McpServer::connect(suite.server.clone())
        .await
        .expect("connect");
    let first = started.elapsed();
    assert_eq!(server.negotiated_protocol().as_deref(), Some("2025-11-25"));
    let r = server
        .call_tool(
            "read_text_file",
            json!({"path": "projects/alpha/README.md"}),
            CALL,
        )
        .await
        .expect("call");
    assert!(r.content_text.contains("Owner: Dana Reyes"), "{r:?}");
    // Outside the allowed directory: the server's own refusal, reported as a tool error.
    let r = server
        .call_tool("read_text_file", json!({"path": "/etc/hostname"}), CALL)
        .await
        .expect("call");
    assert!(r.is_error, "{r:?}");

    // A restart reuses the remembered handshake instead of probing again.
    let started = Instant::now();
    server.restart().await.expect("restart");
    let again = started.elapsed();
    assert_eq!(server.negotiated_protocol().as_deref(), Some("2025-11-25"));
    assert_eq!(server.restarts(), 1);
    let r = server
        .call_tool("list_directory", json!({"path": "projects"}), CALL)
        .await
        .expect("call after restart");
    assert!(r.content_text.contains("[DIR] alpha"), "{r:?}");
    println!("server-filesystem: first connect (probe + fallback) {first:?}, restart {again:?}");

    // Why the fallback exists: discover alone is refused by this server.
    let discover_only = suite
        .server
        .clone()
        .with_protocol(ProtocolPref::Version("2026-07-28".into()));
    let e = McpServer::connect(discover_only)
        .await
        .expect_err("TS SDK 1.x has no discover");
    assert!(
        matches!(e, EvalError::Connect { .. }) && e.is_infrastructure(),
        "{e}"
    );
}

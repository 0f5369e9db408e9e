//! What the web service's tests share: a fresh store on SQLite or on the PostgreSQL that `scripts/test` starts, the
//! real server on port 0 over it, an HTTP client, and a reader of server-sent events.

#![allow(dead_code)]

pub mod cdp;

use reqwest::{Client, Response, StatusCode};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tooltune_store::Store;
use tooltune_web::{ServeConfig, Server, Token};

/// The bearer token the test servers require.
pub const TOKEN: &str = "test-token-0123456789abcdef";

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("web has a parent")
        .to_path_buf()
}

/// A fresh database: a SQLite file in a temporary folder, or a new database on the test PostgreSQL.
pub struct TestDb {
    /// What `Store::open` takes.
    pub url: String,
    pg_admin: Option<(String, String)>,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    /// A SQLite file.
    pub fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().expect("tempdir");
        TestDb {
            url: dir.path().join("web.sqlite").display().to_string(),
            pg_admin: None,
            _dir: Some(dir),
        }
    }

    /// A new database on the PostgreSQL named by `TOOLTUNE_TEST_POSTGRES_URL` (required, as in the store's tests).
    pub async fn postgres() -> TestDb {
        use sqlx::Connection;
        let admin = std::env::var("TOOLTUNE_TEST_POSTGRES_URL").expect(
            "TOOLTUNE_TEST_POSTGRES_URL must name a PostgreSQL server: run the tests through scripts/test, which starts one",
        );
        let name = format!("tooltune_web_{}", uuid_like());
        let mut c = sqlx::PgConnection::connect(&admin)
            .await
            .expect("connect to the test PostgreSQL");
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut c)
            .await
            .expect("create test database");
        let (base, _) = admin.rsplit_once('/').expect("URL with a database path");
        TestDb {
            url: format!("{base}/{name}"),
            pg_admin: Some((admin, name)),
            _dir: None,
        }
    }

    /// Drops a PostgreSQL database (best-effort: the cluster is a throwaway one).
    pub async fn finish(self) {
        if let Some((admin, name)) = &self.pg_admin {
            use sqlx::Connection;
            if let Ok(mut c) = sqlx::PgConnection::connect(admin).await {
                let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .execute(&mut c)
                    .await;
            }
        }
    }
}

fn uuid_like() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{}_{t}", std::process::id())
}

/// The real server on a loopback port, with a client for it.
pub struct TestServer {
    pub server: Server,
    pub store: Store,
    pub base: String,
    pub client: Client,
}

/// A configuration for tests: loopback port 0, the test token, the workspace's suites.
pub fn config() -> ServeConfig {
    let mut cfg = ServeConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)));
    cfg.token = Some(Token::new(TOKEN.into()).expect("token"));
    cfg.suites_dir = workspace().join("datasets/suites");
    cfg.models = vec!["local:fast".into()];
    cfg
}

impl TestServer {
    /// Opens the store and starts the server on it.
    pub async fn start(db: &TestDb, cfg: ServeConfig) -> TestServer {
        // The server's log goes to the test's captured output, shown when a test fails.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_env("TOOLTUNE_LOG")
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
            )
            .with_test_writer()
            .try_init();
        let store = Store::open(&db.url).await.expect("open store");
        let server = Server::start(store.clone(), cfg)
            .await
            .expect("start server");
        let base = format!("http://{}", server.local_addr());
        TestServer {
            server,
            store,
            base,
            client: Client::builder()
                .timeout(Duration::from_secs(120))
                .build()
                .expect("client"),
        }
    }

    /// Stops the server and closes the store.
    pub async fn stop(self) {
        self.server.shutdown().await.expect("shutdown");
        self.store.close().await;
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn get(&self, path: &str) -> Response {
        self.client.get(self.url(path)).send().await.expect("GET")
    }

    pub async fn get_json(&self, path: &str) -> Value {
        let r = self.get(path).await;
        assert_eq!(r.status(), StatusCode::OK, "GET {path}");
        r.json().await.expect("JSON")
    }

    pub async fn get_text(&self, path: &str) -> String {
        let r = self.get(path).await;
        assert_eq!(r.status(), StatusCode::OK, "GET {path}");
        r.text().await.expect("text")
    }

    /// A POST with the bearer token.
    pub fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.client
            .post(self.url(path))
            .header("Authorization", format!("Bearer {TOKEN}"))
    }

    /// Starts a run; returns its id.
    pub async fn start_run(&self, body: Value) -> String {
        let r = self
            .post("/api/runs")
            .json(&body)
            .send()
            .await
            .expect("POST run");
        let status = r.status();
        let v: Value = r.json().await.expect("JSON");
        assert_eq!(status, StatusCode::CREATED, "POST /api/runs: {v}");
        v["run"]["id"].as_str().expect("run id").to_string()
    }
}

/// One server-sent event.
#[derive(Debug, Clone)]
pub struct Sse {
    pub id: Option<String>,
    pub event: String,
    pub data: String,
}

impl Sse {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or(Value::Null)
    }
}

/// Reads an event stream as it arrives.
pub struct SseReader {
    response: Response,
    buf: String,
}

impl SseReader {
    /// Opens `GET path` as an event stream, optionally resuming after an event id.
    pub async fn open(t: &TestServer, path: &str, last_event_id: Option<&str>) -> SseReader {
        let mut req = t
            .client
            .get(t.url(path))
            .header("Accept", "text/event-stream")
            .timeout(Duration::from_secs(3600));
        if let Some(id) = last_event_id {
            req = req.header("Last-Event-ID", id);
        }
        let response = req.send().await.expect("open event stream");
        assert_eq!(response.status(), StatusCode::OK, "GET {path}");
        assert!(
            response
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream")),
            "not an event stream"
        );
        SseReader {
            response,
            buf: String::new(),
        }
    }

    /// The next event (comments such as keep-alives skipped), `None` at the end of the stream; panics after
    /// `deadline`.
    pub async fn next(&mut self, deadline: Instant) -> Option<Sse> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut e = Sse {
                    id: None,
                    event: "message".into(),
                    data: String::new(),
                };
                let mut any = false;
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        e.id = Some(v.trim().to_string());
                        any = true;
                    } else if let Some(v) = line.strip_prefix("event:") {
                        e.event = v.trim().to_string();
                        any = true;
                    } else if let Some(v) = line.strip_prefix("data:") {
                        if !e.data.is_empty() {
                            e.data.push('\n');
                        }
                        e.data.push_str(v.strip_prefix(' ').unwrap_or(v));
                        any = true;
                    }
                }
                if any {
                    return Some(e);
                }
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "no event before the deadline");
            match tokio::time::timeout(left, self.response.chunk()).await {
                Ok(Ok(Some(bytes))) => self.buf.push_str(&String::from_utf8_lossy(&bytes)),
                Ok(Ok(None)) => return None,
                Ok(Err(e)) => panic!("event stream broke: {e}"),
                Err(_) => panic!("no event before the deadline"),
            }
        }
    }
}

/// Builds the example MCP servers (as the CLI's optimize test does) beside the test executable, where suites
/// look for them when `TOOLTUNE_BIN_DIR` is unset (the folder of the running program, leaving cargo's `deps/`).
pub fn build_example_servers() {
    let exe = std::env::current_exe().expect("test executable");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/PROFILE/deps/test")
        .to_path_buf();
    let mut cmd = std::process::Command::new(env!("CARGO"));
    cmd.current_dir(workspace())
        .args(["build", "-q", "-p", "contractor", "-p", "week01-tools"]);
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    assert!(
        cmd.status().expect("cargo").success(),
        "building the example servers"
    );
}

/// Where CI keeps files worth looking at after a run: `target/artefacts`.
pub fn artefacts_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    // target/PROFILE/deps/TEST
    exe.parent()
        .and_then(Path::parent)
        .and_then(Path::parent)
        .map(|t| t.join("artefacts"))
        .unwrap_or_else(|| workspace().join("target/artefacts"))
}

//! What `tooltune proxy` adds to a `tools/call`, over stdio and over Streamable HTTP: the same sequential calls to
//! the contractor server, directly and through the proxy (recording on, into a SQLite store), with p50 and p99 of
//! each and the difference.
//!
//! `cargo bench --workspace --release --bench proxy` (TOOLTUNE_BENCH_CALLS sets the number of calls per transport
//! and path, default 2000).

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

struct Conn {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Conn {
    fn start(cmd: &[String]) -> Conn {
        let mut child = Command::new(&cmd[0])
            .args(&cmd[1..])
            .env("TOOLTUNE_LOG", "error")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut c = Conn {
            child,
            stdin,
            stdout,
        };
        c.request(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}));
        c.send(&json!({"jsonrpc":"2.0","method":"notifications/initialized"}));
        c.request(json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}));
        c
    }

    fn send(&mut self, v: &Value) {
        writeln!(self.stdin, "{v}").expect("send");
        self.stdin.flush().expect("flush");
    }

    fn request(&mut self, v: Value) -> Value {
        let id = v["id"].clone();
        self.send(&v);
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                self.stdout.read_line(&mut line).expect("read") > 0,
                "closed"
            );
            let r: Value = serde_json::from_str(&line).expect("json");
            if r["id"] == id && r.get("method").is_none() {
                return r;
            }
        }
    }

    fn stop(mut self) {
        drop(self.stdin);
        let _ = self.child.wait();
    }
}

/// One Streamable HTTP session, as a host keeps it: one client, the session id and protocol revision the server
/// gave sent with every later request. `fresh`: a new TCP connection per request instead of a kept-alive one.
struct HttpConn {
    client: reqwest::Client,
    url: String,
    session: Option<String>,
}

impl HttpConn {
    async fn start(url: &str, fresh: bool) -> HttpConn {
        let mut builder = reqwest::Client::builder().tcp_nodelay(true);
        if fresh {
            builder = builder.pool_max_idle_per_host(0);
        }
        let mut c = HttpConn {
            client: builder.build().expect("client"),
            url: url.to_string(),
            session: None,
        };
        let (r, session) = c.post(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}})).await;
        assert!(r.is_some_and(|r| r.get("result").is_some()), "initialize");
        c.session = session;
        c.post(json!({"jsonrpc":"2.0","method":"notifications/initialized"}))
            .await;
        c.post(json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}))
            .await;
        c
    }

    /// Posts one message; returns the JSON-RPC answer (a JSON body, or the last `data:` of an SSE body) and the
    /// session id the server named.
    async fn post(&self, v: Value) -> (Option<Value>, Option<String>) {
        let mut req = self
            .client
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(s) = &self.session {
            req = req
                .header("mcp-session-id", s)
                .header("mcp-protocol-version", "2025-06-18");
        }
        let resp = req.body(v.to_string()).send().await.expect("post");
        let session = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|h| h.to_str().ok())
            .map(str::to_string);
        let text = resp.text().await.expect("body");
        let payload = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .next_back()
            .unwrap_or(&text)
            .trim();
        (serde_json::from_str(payload).ok(), session)
    }

    async fn stop(self) {
        if let Some(s) = &self.session {
            let _ = self
                .client
                .delete(&self.url)
                .header("mcp-session-id", s)
                .send()
                .await;
        }
    }
}

async fn run_http(url: &str, calls: usize, fresh: bool) -> Vec<f64> {
    let c = HttpConn::start(url, fresh).await;
    let mut ms = Vec::with_capacity(calls);
    for i in 0..calls + 50 {
        let t = Instant::now();
        let (r, _) = c.post(json!({"jsonrpc":"2.0","id": 10 + i,"method":"tools/call","params":{"name":"search_docs","arguments":{"query":"webhook signature header"}}})).await;
        let dt = t.elapsed().as_secs_f64() * 1000.0;
        assert!(
            r.as_ref().is_some_and(|r| r.get("result").is_some()),
            "{r:?}"
        );
        if i >= 50 {
            ms.push(dt);
        }
    }
    c.stop().await;
    ms.sort_by(f64::total_cmp);
    ms
}

/// Starts a process that prints its URL as the first line of its stdout (the contractor with `--http`, the proxy
/// with `--listen`).
fn start_listening(cmd: &mut Command) -> (Child, String) {
    let mut child = cmd
        .env("TOOLTUNE_LOG", "error")
        .stdout(Stdio::piped())
        // The proxy says where it listens on stderr too; the URL on stdout is what is read.
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let mut url = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut url)
        .expect("url");
    assert!(url.starts_with("http://"), "no URL printed: {url:?}");
    (child, url.trim().to_string())
}

fn print_table(title: &str, d: &[f64], p: &[f64]) {
    println!("{title}");
    println!("{:<28} {:>10} {:>10}", "", "p50 ms", "p99 ms");
    println!(
        "{:<28} {:>10.3} {:>10.3}",
        "direct",
        quantile(d, 0.5),
        quantile(d, 0.99)
    );
    println!(
        "{:<28} {:>10.3} {:>10.3}",
        "through proxy (recording)",
        quantile(p, 0.5),
        quantile(p, 0.99)
    );
    println!(
        "{:<28} {:>10.3} {:>10.3}",
        "added",
        quantile(p, 0.5) - quantile(d, 0.5),
        quantile(p, 0.99) - quantile(d, 0.99)
    );
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn run(cmd: &[String], calls: usize) -> Vec<f64> {
    let mut c = Conn::start(cmd);
    let mut ms = Vec::with_capacity(calls);
    for i in 0..calls + 50 {
        let t = Instant::now();
        let r = c.request(json!({"jsonrpc":"2.0","id": 10 + i,"method":"tools/call","params":{"name":"search_docs","arguments":{"query":"webhook signature header"}}}));
        let dt = t.elapsed().as_secs_f64() * 1000.0;
        assert!(r.get("result").is_some(), "{r}");
        // The first 50 warm up caches on both paths.
        if i >= 50 {
            ms.push(dt);
        }
    }
    c.stop();
    ms.sort_by(f64::total_cmp);
    ms
}

fn main() {
    let calls: usize = std::env::var("TOOLTUNE_BENCH_CALLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .to_path_buf();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_tooltune"));
    let dir = bin.parent().expect("bin dir");
    let status = Command::new(env!("CARGO"))
        .current_dir(&workspace)
        .args(["build", "-q", "--release", "-p", "contractor"])
        .status()
        .expect("cargo");
    assert!(status.success());
    let server = vec![
        dir.join("contractor").display().to_string(),
        "--data".into(),
        workspace
            .join("datasets/contractor/data")
            .display()
            .to_string(),
    ];
    let tmp = tempfile::tempdir().expect("tmp");
    let db = tmp.path().join("bench.db").display().to_string();
    let ov = tmp.path().join("ov.json");
    std::fs::write(
        &ov,
        r#"{"search_docs": "Search Quillmark's internal documentation."}"#,
    )
    .expect("overrides");
    let mut proxied = vec![
        bin.display().to_string(),
        "--database-url".into(),
        db,
        "proxy".into(),
        "--overrides".into(),
        ov.display().to_string(),
        "--record".into(),
        "calls".into(),
        "--".into(),
    ];
    proxied.extend(server.iter().cloned());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    // Alternate the two paths so that drift in the machine's load falls on both.
    let (mut d, mut p) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        d.extend(run(&server, calls / 2));
        p.extend(run(&proxied, calls / 2));
    }
    d.sort_by(f64::total_cmp);
    p.sort_by(f64::total_cmp);
    print_table(
        &format!("tools/call over stdio, {calls} sequential calls each, {cpu}"),
        &d,
        &p,
    );

    // Streamable HTTP: one upstream for both paths; a proxy per round, recording into its own store.
    let (mut upstream, url) = start_listening(
        Command::new(&server[0])
            .args(&server[1..])
            .args(["--http", "127.0.0.1:0"]),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // Both ways a host may connect: one kept-alive connection (what hosts do), and a fresh connection per request.
    // Before the example servers set TCP_NODELAY, every direct call on a kept-alive connection waited about 44 ms
    // for a delayed ACK; now both paths compare the proxy's own work.
    for fresh in [false, true] {
        let (mut d, mut p) = (Vec::new(), Vec::new());
        for round in 0..2 {
            d.extend(rt.block_on(run_http(&url, calls / 2, fresh)));
            let db = tmp.path().join(format!("bench-http-{fresh}-{round}.db"));
            let (proxy, purl) = start_listening(
                Command::new(&bin)
                    .arg("--database-url")
                    .arg(&db)
                    .args([
                        "proxy",
                        "--listen",
                        "127.0.0.1:0",
                        "--upstream",
                        &url,
                        "--overrides",
                    ])
                    .arg(&ov)
                    .args(["--record", "calls"]),
            );
            p.extend(rt.block_on(run_http(&purl, calls / 2, fresh)));
            // Ctrl-C is how the proxy is stopped; it then stores what it recorded.
            let _ = Command::new("kill")
                .args(["-INT", &proxy.id().to_string()])
                .status();
            let out = proxy.wait_with_output().expect("proxy");
            assert!(out.status.success(), "proxy over HTTP failed");
        }
        d.sort_by(f64::total_cmp);
        p.sort_by(f64::total_cmp);
        let how = if fresh {
            "a new host connection per request"
        } else {
            "one kept-alive host connection"
        };
        print_table(
            &format!(
                "tools/call over Streamable HTTP, {how}, {calls} sequential calls each, {cpu}"
            ),
            &d,
            &p,
        );
    }
    let _ = upstream.kill();
    let _ = upstream.wait();
}

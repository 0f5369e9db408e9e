//! What `tooltune proxy` adds to a `tools/call` over stdio: the same sequential calls to the contractor server,
//! directly and through the proxy (recording on, into a SQLite store), with p50 and p99 of each and the difference.
//!
//! `cargo bench --workspace --bench proxy` (TOOLTUNE_BENCH_CALLS sets the number of calls, default 2000).

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
    println!("tools/call over stdio, {calls} sequential calls each, {cpu}");
    println!("{:<28} {:>10} {:>10}", "", "p50 ms", "p99 ms");
    println!(
        "{:<28} {:>10.3} {:>10.3}",
        "direct",
        quantile(&d, 0.5),
        quantile(&d, 0.99)
    );
    println!(
        "{:<28} {:>10.3} {:>10.3}",
        "through proxy (recording)",
        quantile(&p, 0.5),
        quantile(&p, 0.99)
    );
    println!(
        "{:<28} {:>10.3} {:>10.3}",
        "added",
        quantile(&p, 0.5) - quantile(&d, 0.5),
        quantile(&p, 0.99) - quantile(&d, 0.99)
    );
}

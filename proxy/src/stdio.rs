//! The stdio transport: tooltune is the host's server, the real server is its child. MCP over stdio is one JSON-RPC
//! message per line in each direction, so the proxy reads lines and writes them on, as bytes.
//!
//! Three tasks: host to server, server to host, and one writer to the host (the proxy also answers the host
//! itself: a line that is not JSON, a request the server can no longer answer, one that timed out). The child's
//! stderr is the proxy's stderr, where MCP servers log.

use crate::ProxyError;
use crate::record::Recorder;
use crate::session::{Event, FromHost, Session, SessionConfig, UPSTREAM_ERROR, error_reply};
use serde_json::{Value, json};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// How the proxy runs one session.
#[derive(Debug, Clone, Default)]
pub struct StdioOptions {
    /// What to rewrite and record.
    pub session: SessionConfig,
    /// A request the server has not answered after this long gets an error reply (`None`: wait for ever; MCP
    /// hosts have timeouts of their own).
    pub request_timeout: Option<Duration>,
}

/// How the session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    /// The server's exit status, as text (`None` when it was still running and was stopped).
    pub server_exit: Option<String>,
    /// Requests the proxy answered with an error because the server could not.
    pub failed_for_the_server: u64,
}

/// The name recorded for a server: its program's file name, never its arguments (they may hold tokens).
pub fn server_name(command: &[String]) -> String {
    command
        .first()
        .map(|p| {
            std::path::Path::new(p)
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_else(|| p.clone())
        })
        .unwrap_or_default()
}

fn spawn(command: &[String]) -> Result<Child, ProxyError> {
    let (program, args) = command.split_first().ok_or_else(|| ProxyError::Spawn {
        command: String::new(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "no command given"),
    })?;
    Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| ProxyError::Spawn {
            command: program.clone(),
            source,
        })
}

/// Starts the server once on its own, asks for its tools (every page) and stops it: the names the proxy may
/// rewrite are checked before the host connects, so a misspelt tool is a start-up error, not a silent no-op.
pub async fn list_tools(command: &[String], timeout: Duration) -> Result<Vec<String>, ProxyError> {
    let server = server_name(command);
    let probe = |message: String| ProxyError::Probe {
        server: server.clone(),
        message,
    };
    let mut child = spawn(command)?;
    let mut stdin = child.stdin.take().ok_or_else(|| probe("no stdin".into()))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| probe("no stdout".into()))?;
    let mut lines = BufReader::new(stdout).lines();
    let work = async {
        let send = |v: Value| {
            let mut b = v.to_string().into_bytes();
            b.push(b'\n');
            b
        };
        stdin
            .write_all(&send(json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "tooltune-proxy-check", "version": env!("CARGO_PKG_VERSION")}}})))
            .await?;
        wait_for(&mut lines, 0).await?;
        stdin
            .write_all(&send(
                json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            ))
            .await?;
        let mut names = Vec::new();
        let mut cursor: Option<Value> = None;
        for id in 1..1000 {
            let params = match &cursor {
                Some(c) => json!({"cursor": c}),
                None => json!({}),
            };
            stdin
                .write_all(&send(
                    json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": params}),
                ))
                .await?;
            let r = wait_for(&mut lines, id).await?;
            if let Some(e) = r.get("error") {
                return Err(std::io::Error::other(format!("tools/list failed: {e}")));
            }
            for t in r
                .pointer("/result/tools")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(n) = t.get("name").and_then(Value::as_str) {
                    names.push(n.to_string());
                }
            }
            cursor = r
                .pointer("/result/nextCursor")
                .filter(|c| !c.is_null())
                .cloned();
            if cursor.is_none() {
                break;
            }
        }
        Ok::<_, std::io::Error>(names)
    };
    let result = tokio::time::timeout(timeout, work).await;
    let _ = child.start_kill();
    match result {
        Ok(Ok(names)) => Ok(names),
        Ok(Err(e)) => Err(probe(e.to_string())),
        Err(_) => Err(probe(format!(
            "no answer within {} s (use --no-check to skip this check)",
            timeout.as_secs()
        ))),
    }
}

async fn wait_for(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    id: i64,
) -> std::io::Result<Value> {
    while let Some(l) = lines.next_line().await? {
        let Ok(v) = serde_json::from_str::<Value>(&l) else {
            continue;
        };
        if v.get("id").and_then(Value::as_i64) == Some(id) && v.get("method").is_none() {
            return Ok(v);
        }
    }
    Err(std::io::Error::other("the server closed its output"))
}

/// Runs one session: `host_in`/`host_out` are the host's side (tooltune's stdin and stdout), `command` the
/// server. Returns when the host closes its side (then the server is given a moment to exit, and stopped).
pub async fn run<R, W>(
    command: &[String],
    options: StdioOptions,
    recorder: Option<Recorder>,
    host_in: R,
    host_out: W,
) -> Result<Ended, ProxyError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let mut child = spawn(command)?;
    let server = server_name(command);
    let mut child_in = child.stdin.take();
    let child_out = child.stdout.take();
    let session = Arc::new(Mutex::new(Session::new(options.session.clone())));
    let (to_host, mut host_queue) = mpsc::unbounded_channel::<Vec<u8>>();
    let upstream_gone = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let failed = Arc::new(std::sync::atomic::AtomicU64::new(0));

    // The only writer to the host.
    let writer = tokio::spawn(async move {
        let mut out = host_out;
        while let Some(bytes) = host_queue.recv().await {
            if out.write_all(&bytes).await.is_err() || out.flush().await.is_err() {
                break;
            }
        }
    });

    let record = |events: Vec<Event>, rec: &Option<Recorder>| {
        for e in events {
            if let Event::MissingTools(m) = &e {
                tracing::warn!(
                    "the server's tools/list has no {}: their descriptions are not rewritten",
                    m.join(", ")
                );
            }
            if let Some(r) = rec {
                r.record(e);
            }
        }
    };

    // Server to host.
    let from_server = {
        let session = session.clone();
        let to_host = to_host.clone();
        let rec = recorder.clone();
        let gone = upstream_gone.clone();
        let failed = failed.clone();
        let server = server.clone();
        tokio::spawn(async move {
            if let Some(out) = child_out {
                let mut reader = BufReader::new(out);
                let mut line = Vec::new();
                loop {
                    line.clear();
                    match reader.read_until(b'\n', &mut line).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                    let r = session
                        .lock()
                        .map(|mut s| s.from_server(&line, Instant::now()));
                    match r {
                        Ok(Ok((replacement, events))) => {
                            let _ = to_host.send(replacement.unwrap_or_else(|| line.clone()));
                            record(events, &rec);
                        }
                        Ok(Err(why)) => tracing::warn!(
                            %server,
                            "not forwarded to the host: {why}: {}",
                            String::from_utf8_lossy(&line).trim_end()
                        ),
                        Err(_) => break,
                    }
                }
            }
            // The server is gone: every request still waiting gets an error, and so will every later one.
            gone.store(true, std::sync::atomic::Ordering::SeqCst);
            let pending = session
                .lock()
                .map(|mut s| s.take_pending())
                .unwrap_or_default();
            for id in pending {
                failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let _ = to_host.send(error_reply(
                    &id,
                    UPSTREAM_ERROR,
                    &format!("tooltune proxy: the server `{server}` exited before answering"),
                ));
            }
        })
    };

    // Requests that waited too long.
    let timeouts = options.request_timeout.map(|limit| {
        let session = session.clone();
        let to_host = to_host.clone();
        let failed = failed.clone();
        let server = server.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(250).min(limit));
            loop {
                tick.tick().await;
                let Some(deadline) = Instant::now().checked_sub(limit) else {
                    continue;
                };
                let old = session
                    .lock()
                    .map(|mut s| s.take_older_than(deadline))
                    .unwrap_or_default();
                for id in old {
                    failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let _ = to_host.send(error_reply(
                        &id,
                        UPSTREAM_ERROR,
                        &format!(
                            "tooltune proxy: the server `{server}` did not answer within {} s",
                            limit.as_secs_f64()
                        ),
                    ));
                }
            }
        })
    });

    // Host to server, on this task.
    let mut reader = BufReader::new(host_in);
    let mut line = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line).await? == 0 {
            break;
        }
        let Ok((verdict, events)) = session
            .lock()
            .map(|mut s| s.from_host(&line, Instant::now()))
        else {
            break;
        };
        record(events, &recorder);
        match verdict {
            FromHost::Reply(bytes) => {
                let _ = to_host.send(bytes);
            }
            FromHost::Forward => {
                let mut sent = false;
                if !upstream_gone.load(std::sync::atomic::Ordering::SeqCst)
                    && let Some(w) = child_in.as_mut()
                {
                    sent = w.write_all(&line).await.is_ok() && w.flush().await.is_ok();
                }
                if !sent {
                    // The server cannot take it: answer each request in the line at once.
                    let pending = session
                        .lock()
                        .map(|mut s| s.take_pending())
                        .unwrap_or_default();
                    for id in pending {
                        failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let _ = to_host.send(error_reply(
                            &id,
                            UPSTREAM_ERROR,
                            &format!("tooltune proxy: the server `{server}` is not running"),
                        ));
                    }
                }
            }
        }
    }
    // The host is done: close the server's stdin, give it a moment to exit as MCP's stdio shutdown asks, then stop it.
    drop(child_in.take());
    let status = match tokio::time::timeout(Duration::from_secs(2), child.wait()).await {
        Ok(Ok(s)) => Some(s.to_string()),
        _ => {
            let _ = child.kill().await;
            None
        }
    };
    let _ = from_server.await;
    if let Some(t) = timeouts {
        t.abort();
    }
    drop(to_host);
    let _ = writer.await;
    drop(recorder);
    Ok(Ended {
        server_exit: status,
        failed_for_the_server: failed.load(std::sync::atomic::Ordering::Relaxed),
    })
}

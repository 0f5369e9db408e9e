//! Headless Chromium driven over the DevTools protocol, with nothing but a TCP socket: the WebSocket handshake and
//! framing are a few dozen lines, which is less to go wrong on a CI machine than a browser-automation package
//! (and needs no npm). Only what the browser test needs: navigate, evaluate an expression, wait for a condition,
//! take a screenshot.

use serde_json::{Value, json};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// A headless Chromium and a DevTools connection to its first page.
pub struct Browser {
    child: Child,
    ws: TcpStream,
    next_id: u64,
    _profile: tempfile::TempDir,
}

/// The flags that work in this sandbox (no GPU, no setuid sandbox, nothing fetched from outside).
const FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--window-size=1280,1600",
    "--remote-debugging-port=0",
];

impl Browser {
    /// Starts Chromium (`$TOOLTUNE_CHROMIUM`, else `chromium` on the PATH) with a fresh profile.
    pub async fn launch() -> Browser {
        let program = std::env::var("TOOLTUNE_CHROMIUM").unwrap_or_else(|_| "chromium".into());
        let profile = tempfile::tempdir().expect("profile dir");
        let mut child = Command::new(&program)
            .args(FLAGS)
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start `{program}` ({e}): install Debian's `chromium` package (apt-get install -y chromium)")
            });
        // Chromium writes its port to DevToolsActivePort in the profile once it listens.
        let port_file = profile.path().join("DevToolsActivePort");
        let deadline = Instant::now() + Duration::from_secs(60);
        let port: u16 = loop {
            if let Ok(text) = std::fs::read_to_string(&port_file)
                && let Some(p) = text.lines().next().and_then(|l| l.trim().parse().ok())
            {
                break p;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("chromium exited before listening: {status}");
            }
            assert!(Instant::now() < deadline, "chromium did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let ws_path = page_target(port, deadline).await;
        let mut ws = TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect to DevTools");
        handshake(&mut ws, port, &ws_path).await;
        let mut b = Browser {
            child,
            ws,
            next_id: 0,
            _profile: profile,
        };
        b.call("Page.enable", json!({})).await;
        b.call("Runtime.enable", json!({})).await;
        b
    }

    /// Sends a command and returns its result, skipping the events that arrive meanwhile.
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let msg = json!({ "id": id, "method": method, "params": params }).to_string();
        write_frame(&mut self.ws, msg.as_bytes()).await;
        loop {
            let text = read_message(&mut self.ws).await;
            let v: Value = serde_json::from_str(&text).expect("DevTools sends JSON");
            if v["id"].as_u64() == Some(id) {
                if let Some(e) = v.get("error") {
                    panic!("{method} failed: {e}");
                }
                return v["result"].clone();
            }
        }
    }

    /// Loads a URL and waits for its load event.
    pub async fn goto(&mut self, url: &str) {
        self.call("Page.navigate", json!({ "url": url })).await;
        self.wait_for(
            "document.readyState === 'complete'",
            Duration::from_secs(30),
        )
        .await;
    }

    /// The value of a JavaScript expression in the page.
    pub async fn eval(&mut self, expression: &str) -> Value {
        let r = self
            .call(
                "Runtime.evaluate",
                json!({ "expression": expression, "returnByValue": true }),
            )
            .await;
        if let Some(e) = r.get("exceptionDetails") {
            panic!("`{expression}` threw: {e}");
        }
        r["result"]["value"].clone()
    }

    /// Waits until a JavaScript expression is truthy; panics after `timeout`.
    pub async fn wait_for(&mut self, expression: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.eval(&format!("!!({expression})")).await;
            if v == Value::Bool(true) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for `{expression}`"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Saves a PNG of the whole page.
    pub async fn screenshot(&mut self, path: &Path) {
        let r = self
            .call(
                "Page.captureScreenshot",
                json!({ "format": "png", "captureBeyondViewport": true }),
            )
            .await;
        let png = base64_decode(r["data"].as_str().expect("screenshot data"));
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("artefacts dir");
        }
        std::fs::write(path, png).expect("write screenshot");
    }

    /// Closes the browser (and kills it if it does not go).
    pub async fn close(mut self) {
        self.next_id += 1;
        let msg =
            json!({ "id": self.next_id, "method": "Browser.close", "params": {} }).to_string();
        write_frame(&mut self.ws, msg.as_bytes()).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // A failed test must not leave a browser behind; after `close` this finds the process gone.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The WebSocket path of the first page target, from the DevTools HTTP endpoint.
async fn page_target(port: u16, deadline: Instant) -> String {
    loop {
        if let Ok(r) = reqwest::get(format!("http://127.0.0.1:{port}/json/list")).await
            && let Ok(list) = r.json::<Vec<Value>>().await
            && let Some(url) = list
                .iter()
                .find(|t| t["type"] == "page")
                .and_then(|t| t["webSocketDebuggerUrl"].as_str())
        {
            let path = url
                .split_once("//")
                .and_then(|(_, rest)| rest.split_once('/'))
                .map(|(_, p)| format!("/{p}"))
                .expect("ws URL");
            return path;
        }
        assert!(Instant::now() < deadline, "no page target in chromium");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn handshake(ws: &mut TcpStream, port: u16, path: &str) {
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dG9vbHR1bmUtYnJvd3NlcnQ=\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    ws.write_all(req.as_bytes()).await.expect("handshake");
    let mut reader = BufReader::new(&mut *ws);
    let mut status = String::new();
    reader
        .read_line(&mut status)
        .await
        .expect("handshake reply");
    assert!(status.contains(" 101 "), "WebSocket refused: {status}");
    loop {
        let mut line = String::new();
        reader
            .read_line(&mut line)
            .await
            .expect("handshake headers");
        if line == "\r\n" || line.is_empty() {
            break;
        }
    }
    // The server speaks only after a request, so the buffered reader holds nothing beyond the headers.
    assert!(
        reader.buffer().is_empty(),
        "unexpected bytes after handshake"
    );
}

/// One masked text frame (clients must mask).
async fn write_frame(ws: &mut TcpStream, payload: &[u8]) {
    let mask = [0x5a, 0x17, 0xc3, 0x9e];
    let mut frame = vec![0x81u8];
    let n = payload.len();
    if n < 126 {
        frame.push(0x80 | n as u8);
    } else if n <= u16::MAX as usize {
        frame.push(0x80 | 126);
        frame.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        frame.push(0x80 | 127);
        frame.extend_from_slice(&(n as u64).to_be_bytes());
    }
    frame.extend_from_slice(&mask);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    ws.write_all(&frame).await.expect("write frame");
}

/// One whole message (continuation frames joined); pings are answered.
async fn read_message(ws: &mut TcpStream) -> String {
    let mut message = Vec::new();
    loop {
        let mut head = [0u8; 2];
        ws.read_exact(&mut head).await.expect("read frame");
        let fin = head[0] & 0x80 != 0;
        let opcode = head[0] & 0x0f;
        let mut len = u64::from(head[1] & 0x7f);
        if len == 126 {
            let mut b = [0u8; 2];
            ws.read_exact(&mut b).await.expect("len16");
            len = u64::from(u16::from_be_bytes(b));
        } else if len == 127 {
            let mut b = [0u8; 8];
            ws.read_exact(&mut b).await.expect("len64");
            len = u64::from_be_bytes(b);
        }
        let mut payload = vec![0u8; len as usize];
        ws.read_exact(&mut payload).await.expect("payload");
        match opcode {
            0x8 => panic!("DevTools closed the connection"),
            0x9 => {
                // Pong with the same payload, masked like every client frame.
                let mask = [1u8, 2, 3, 4];
                let mut pong = vec![0x8a, 0x80 | payload.len() as u8];
                pong.extend_from_slice(&mask);
                pong.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
                ws.write_all(&pong).await.expect("pong");
            }
            0xa => {}
            _ => {
                message.extend_from_slice(&payload);
                if fin {
                    return String::from_utf8(message).expect("UTF-8 message");
                }
            }
        }
    }
}

fn base64_decode(s: &str) -> Vec<u8> {
    fn val(c: u8) -> Option<u32> {
        match c {
            b'A'..=b'Z' => Some(u32::from(c - b'A')),
            b'a'..=b'z' => Some(u32::from(c - b'a') + 26),
            b'0'..=b'9' => Some(u32::from(c - b'0') + 52),
            b'+' => Some(62),
            b'/' => Some(63),
            _ => None,
        }
    }
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for v in s.bytes().filter_map(val) {
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

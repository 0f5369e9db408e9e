//! The web service's load check: 200 concurrent clients post traces to `POST /api/traces` for 30 s on loopback,
//! then the store is checked. Prints requests per second, trajectories per second, latency percentiles, and
//! whether every accepted trajectory is in the store exactly once and nothing of a refused request is.
//!
//! ```sh
//! cargo run --release -p tooltune-web --example load                      # SQLite file in a temporary folder
//! cargo run --release -p tooltune-web --example load -- --clients 50 --seconds 10 --records 5
//! cargo run --release -p tooltune-web --example load -- --database-url postgres://postgres@127.0.0.1:54329/load
//! ```
//! A benchmark that prints figures, not a test: it asserts nothing about speed, and exits non-zero only when the
//! store disagrees with what the server answered.

use serde_json::json;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tooltune_core::TrajectoryId;
use tooltune_ingest::{ChunkReader, FormatChoice, ReadOptions};
use tooltune_store::Store;
use tooltune_web::{ServeConfig, Server, Token};

struct Args {
    clients: usize,
    seconds: u64,
    records: usize,
    database_url: Option<String>,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        clients: 200,
        seconds: 30,
        records: 5,
        database_url: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--clients" => a.clients = value()?.parse().map_err(|e| format!("--clients: {e}"))?,
            "--seconds" => a.seconds = value()?.parse().map_err(|e| format!("--seconds: {e}"))?,
            "--records" => a.records = value()?.parse().map_err(|e| format!("--records: {e}"))?,
            "--database-url" => a.database_url = Some(value()?),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if a.clients == 0 || a.seconds == 0 || a.records == 0 {
        return Err("--clients, --seconds and --records must be at least 1".into());
    }
    Ok(a)
}

/// One trajectory in tooltune's format; `task` makes it unique.
fn record(task: &str, n: usize) -> String {
    // Two description versions of `search_docs`, so that the load also exercises description deduplication.
    let docs = if n.is_multiple_of(2) {
        "Search the company's internal documentation."
    } else {
        "Search the internal engineering handbook, SDK and API references."
    };
    json!({
        "task": task,
        "tools": [
            { "name": "search_docs", "description": docs,
              "input_schema": { "type": "object", "properties": { "query": { "type": "string" } }, "required": ["query"] } },
            { "name": "web_search", "description": "Search the web.",
              "input_schema": { "type": "object", "properties": { "query": { "type": "string" } }, "required": ["query"] } }
        ],
        "steps": [
            { "type": "model", "tool_calls": [{ "id": "c1", "name": "search_docs", "arguments": { "query": task } }] },
            { "type": "tool_result", "call_id": "c1", "name": "search_docs", "content": "Two approvals are needed." },
            { "type": "model", "content": "Two." }
        ],
        "final_answer": "Two.",
        "outcome": { "success": !n.is_multiple_of(3) },
        "meta": { "client": "load-check" }
    })
    .to_string()
}

/// What one request came to.
enum Outcome {
    /// 200: every record of the request must be in the store.
    Accepted,
    /// Any other status: none of them may be.
    Refused(u16),
    /// No answer (a client timeout or a broken connection): the store may or may not have them.
    Unknown,
}

struct ClientLog {
    latencies: Vec<Duration>,
    /// Each request's outcome and the body it posted.
    outcomes: Vec<(Outcome, String)>,
}

async fn client(
    http: reqwest::Client,
    url: String,
    token: Arc<String>,
    run: Arc<String>,
    id: usize,
    records: usize,
    until: Instant,
) -> ClientLog {
    let mut log = ClientLog {
        latencies: Vec::new(),
        outcomes: Vec::new(),
    };
    let mut k = 0usize;
    while Instant::now() < until {
        let tasks: Vec<String> = (0..records)
            .map(|i| format!("load check {run}: client {id} request {k} record {i}"))
            .collect();
        let body: String = tasks
            .iter()
            .enumerate()
            .map(|(i, t)| record(t, id + k + i) + "\n")
            .collect();
        k += 1;
        let started = Instant::now();
        let r = http
            .post(&url)
            .header("Authorization", format!("Bearer {token}"))
            .header("Content-Type", "application/x-ndjson")
            .body(body.clone())
            .send()
            .await;
        let outcome = match r {
            Ok(r) => {
                let status = r.status().as_u16();
                // The body is read so that the connection is reused, and shown when it refuses.
                let text = r.text().await.unwrap_or_default();
                if status == 200 {
                    Outcome::Accepted
                } else {
                    // The first refusal's reason, once per run: the rest are counted.
                    static SHOWN: std::sync::Once = std::sync::Once::new();
                    SHOWN.call_once(|| eprintln!("first refusal ({status}): {}", text.trim()));
                    Outcome::Refused(status)
                }
            }
            Err(_) => Outcome::Unknown,
        };
        log.latencies.push(started.elapsed());
        log.outcomes.push((outcome, body));
    }
    log
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The content addresses of the records one request posted, read by the same reader the server uses, so the
/// check asks the store through its own API (a query of its tables rotted when the schema changed).
fn posted_ids(body: &str) -> Result<Vec<TrajectoryId>, String> {
    let mut reader = ChunkReader::new(
        std::io::Cursor::new(body.as_bytes().to_vec()),
        "load check",
        FormatChoice::Auto,
        ReadOptions::default(),
    )
    .map_err(|e| e.to_string())?;
    let mut ids = Vec::new();
    while let Some(chunk) = reader.next_chunk().map_err(|e| e.to_string())? {
        for p in chunk {
            ids.push(p.result.map_err(|e| e.to_string())?.id());
        }
    }
    Ok(ids)
}

/// How many of `ids` the store holds.
async fn present(store: &Store, ids: &[TrajectoryId]) -> Result<usize, tooltune_store::StoreError> {
    let mut n = 0;
    for id in ids {
        if store.trajectory(id).await?.is_some() {
            n += 1;
        }
    }
    Ok(n)
}

#[tokio::main]
async fn main() -> ExitCode {
    // The server's own log (a refused request's cause is written there), at the level TOOLTUNE_LOG names.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TOOLTUNE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: temporary folder: {e}");
            return ExitCode::FAILURE;
        }
    };
    let db = a
        .database_url
        .clone()
        .unwrap_or_else(|| dir.path().join("load.sqlite").display().to_string());
    let store = match Store::open(&db).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let backend = format!("{:?}", store.backend());
    // A throwaway token made of the time and the process id: the check needs one, not a secret one.
    let token = format!(
        "load-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    );
    let mut cfg = ServeConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)));
    cfg.token = Token::new(token.clone()).ok();
    cfg.resume = false;
    let server = match Server::start(store.clone(), cfg).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let url = format!("http://{}/api/traces", server.local_addr());
    let before = store.count_trajectories().await.unwrap_or(0);
    println!(
        "load check: {} clients posting {} trajectories per request for {} s to {url} ({backend})",
        a.clients, a.records, a.seconds
    );

    let http = match reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(a.clients)
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: HTTP client: {e}");
            return ExitCode::FAILURE;
        }
    };
    let token = Arc::new(token);
    // Tasks are unique to this run (the temporary folder's random name), so a second run against the same
    // database adds its own rows and the count below still holds.
    let run = Arc::new(
        dir.path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    );
    let started = Instant::now();
    let until = started + Duration::from_secs(a.seconds);
    let handles: Vec<_> = (0..a.clients)
        .map(|id| {
            tokio::spawn(client(
                http.clone(),
                url.clone(),
                token.clone(),
                run.clone(),
                id,
                a.records,
                until,
            ))
        })
        .collect();
    let mut latencies = Vec::new();
    let mut accepted: Vec<String> = Vec::new();
    let mut refused: Vec<String> = Vec::new();
    let mut unanswered: Vec<String> = Vec::new();
    let (mut n_accepted, mut n_refused, mut n_unknown) = (0u64, 0u64, 0u64);
    let mut statuses: std::collections::BTreeMap<u16, u64> = Default::default();
    for h in handles {
        let Ok(log) = h.await else { continue };
        latencies.extend(log.latencies);
        for (o, body) in log.outcomes {
            match o {
                Outcome::Accepted => {
                    n_accepted += 1;
                    accepted.push(body);
                }
                Outcome::Refused(s) => {
                    n_refused += 1;
                    *statuses.entry(s).or_default() += 1;
                    refused.push(body);
                }
                Outcome::Unknown => {
                    n_unknown += 1;
                    unanswered.push(body);
                }
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let _ = server.shutdown().await;
    latencies.sort();
    let total = latencies.len() as f64;
    println!(
        "requests: {} in {elapsed:.1} s = {:.0} requests/s; accepted {n_accepted} ({:.0} trajectories/s), refused {n_refused} {:?}, no answer {n_unknown}",
        latencies.len(),
        total / elapsed,
        (n_accepted as f64 * a.records as f64) / elapsed,
        statuses
    );
    println!(
        "latency: p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        percentile(&latencies, 50.0).as_secs_f64() * 1000.0,
        percentile(&latencies, 90.0).as_secs_f64() * 1000.0,
        percentile(&latencies, 99.0).as_secs_f64() * 1000.0,
        latencies.last().copied().unwrap_or_default().as_secs_f64() * 1000.0,
    );

    // The store against what the server answered, asked through the store's own API.
    let ids = |bodies: &[String]| -> Result<Vec<TrajectoryId>, String> {
        let mut out = Vec::new();
        for b in bodies {
            out.extend(posted_ids(b)?);
        }
        Ok(out)
    };
    let (accepted, refused, unanswered) = match (ids(&accepted), ids(&refused), ids(&unanswered)) {
        (Ok(a), Ok(r), Ok(u)) => (a, r, u),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            eprintln!("error: reading back what was posted: {e}");
            return ExitCode::FAILURE;
        }
    };
    let counts = async {
        Ok::<_, tooltune_store::StoreError>((
            present(&store, &accepted).await?,
            present(&store, &refused).await?,
            present(&store, &unanswered).await?,
        ))
    };
    let (missing, leaked, found_unanswered) = match counts.await {
        Ok((a, r, u)) => (accepted.len() - a, r, u),
        Err(e) => {
            eprintln!("error: reading the store back: {e}");
            return ExitCode::FAILURE;
        }
    };
    let after = store.count_trajectories().await.unwrap_or(0);
    store.close().await;
    // Every record is unique by its task, so the rows added must be exactly the accepted ones plus those of
    // unanswered requests that made it in: more would be a record stored twice.
    let added = after.saturating_sub(before);
    let expected = (accepted.len() - missing + leaked + found_unanswered) as u64;
    let duplicated = added.saturating_sub(expected);
    let ok = missing == 0 && duplicated == 0 && leaked == 0 && added == expected;
    println!(
        "store: {added} trajectories added ({} accepted, {found_unanswered} of {} unanswered stored); {missing} accepted ones missing, {duplicated} extra rows, {leaked} from refused requests stored: {}",
        accepted.len(),
        unanswered.len(),
        if ok { "consistent" } else { "INCONSISTENT" }
    );
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

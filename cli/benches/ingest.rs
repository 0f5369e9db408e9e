//! Ingest benchmark: generates N synthetic trajectories (5 tools, 6 steps each) in every trace format, ingests
//! each file with the real `tooltune` binary into a fresh SQLite file or PostgreSQL database, and prints
//! trajectories per second and the child's peak RSS.
//!
//! Run: `cargo bench -p tooltune --bench ingest -- [--n 200000] [--formats tooltune,openai,langfuse,otel]
//! [--backends sqlite,postgres|none] [--phases] [--dir DIR] [--keep]`. PostgreSQL comes from `TOOLTUNE_TEST_POSTGRES_URL`
//! (a server URL whose user may create databases); each run gets a fresh database that is dropped afterwards.
//! `--phases` also times, in this process and without any database, the parse alone (`ChunkReader`) and the parse
//! plus what the store computes before SQL (ids, JSON body), to tell the CPU side of an ingest from the inserts.
//!
//! Every record is one trajectory of the same shape in all four formats: a task, 5 tools shown (each with a
//! description of a few hundred bytes and a 3-property schema), and 6 steps: model turn calling one tool, its
//! result, model turn calling two tools in parallel, their two results, final model turn with the answer.
//! How each format spells a "step" is said at its writer below.

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Instant;
use tooltune_ingest::{ChunkReader, Format, FormatChoice, ReadOptions};

// The same allocator as the `tooltune` binary, so the in-process phase timings compare with its ingest.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const POSTGRES_ENV: &str = "TOOLTUNE_TEST_POSTGRES_URL";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

struct Args {
    n: u64,
    formats: Vec<Format>,
    backends: Vec<Backend>,
    phases: bool,
    dir: Option<PathBuf>,
    /// Keep the generated files (in `--dir`), e.g. to profile an ingest of them by hand.
    keep: bool,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        n: 200_000,
        formats: Format::ALL.to_vec(),
        backends: Vec::new(),
        phases: false,
        dir: None,
        keep: false,
    };
    let mut backends_given = false;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().with_context(|| format!("{name} needs a value"));
        match a.as_str() {
            // `cargo bench` passes `--bench` to every bench binary.
            "--bench" => {}
            "--n" => {
                let v = value("--n")?;
                args.n = v
                    .replace('_', "")
                    .parse()
                    .with_context(|| format!("--n {v}: not a count"))?;
                ensure!(args.n > 0, "--n must be at least 1");
            }
            "--formats" => {
                args.formats = value("--formats")?
                    .split(',')
                    .map(|f| f.parse::<Format>().map_err(anyhow::Error::from))
                    .collect::<Result<_>>()?;
            }
            "--backends" => {
                backends_given = true;
                let v = value("--backends")?;
                // `none` runs only the generator and, with `--phases`, the in-process phase timings.
                args.backends = v
                    .split(',')
                    .filter(|b| b.trim() != "none")
                    .map(|b| match b.trim() {
                        "sqlite" => Ok(Backend::Sqlite),
                        "postgres" => Ok(Backend::Postgres),
                        other => {
                            bail!("--backends: unknown backend `{other}` (sqlite, postgres, none)")
                        }
                    })
                    .collect::<Result<_>>()?;
            }
            "--phases" => args.phases = true,
            "--keep" => args.keep = true,
            "--dir" => args.dir = Some(PathBuf::from(value("--dir")?)),
            other => bail!(
                "unknown argument `{other}`; usage: [--n N] [--formats tooltune,openai,langfuse,otel] \
                 [--backends sqlite,postgres|none] [--phases] [--dir DIR] [--keep]"
            ),
        }
    }
    if !backends_given {
        args.backends.push(Backend::Sqlite);
        if std::env::var_os(POSTGRES_ENV).is_some() {
            args.backends.push(Backend::Postgres);
        } else {
            eprintln!("note: {POSTGRES_ENV} is not set; benchmarking SQLite only");
        }
    }
    Ok(args)
}

struct Row {
    format: Format,
    backend: &'static str,
    n: u64,
    seconds: f64,
    peak_rss_mb: f64,
    file_mb: f64,
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let mut tmp = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("--dir {}", d.display()))?;
            tempfile::Builder::new()
                .prefix("tooltune-bench-")
                .tempdir_in(d)
                .with_context(|| format!("--dir {}", d.display()))?
        }
        None => tempfile::Builder::new()
            .prefix("tooltune-bench-")
            .tempdir()?,
    };
    // `--keep` leaves the folder and the generated files behind.
    if args.keep {
        tmp.disable_cleanup(true);
        println!("keeping the generated files in {}", tmp.path().display());
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let pg_admin = if args.backends.contains(&Backend::Postgres) {
        Some(std::env::var(POSTGRES_ENV).with_context(|| {
            format!("--backends postgres needs {POSTGRES_ENV} (start one with .ci/start-postgres)")
        })?)
    } else {
        None
    };
    println!(
        "ingest bench: {} trajectories per format, 5 tools and 6 steps each, binary {}",
        args.n,
        env!("CARGO_BIN_EXE_tooltune")
    );
    let mut rows = Vec::new();
    let mut phases = Vec::new();
    for &format in &args.formats {
        let file = tmp.path().join(format!("{}.jsonl", format.name()));
        let started = Instant::now();
        generate(&file, format, args.n)?;
        let file_mb = std::fs::metadata(&file)?.len() as f64 / 1e6;
        println!(
            "generated {}: {:.0} MB in {:.1} s",
            file.display(),
            file_mb,
            started.elapsed().as_secs_f64()
        );
        if args.phases {
            let mut timings = [0.0; 2];
            for (k, prepare) in [false, true].into_iter().enumerate() {
                let (seconds, valid) = parse_only(&file, format, prepare)?;
                ensure!(
                    valid == args.n,
                    "{format}: the parser accepted {valid} of {} records",
                    args.n
                );
                println!(
                    "  {} ({format}, in process): {seconds:.2} s, {:.0} trajectories/s",
                    if prepare {
                        "parse + ids + body"
                    } else {
                        "parse only"
                    },
                    args.n as f64 / seconds
                );
                timings[k] = seconds;
            }
            phases.push((format, timings));
        }
        for &backend in &args.backends {
            let row = match backend {
                Backend::Sqlite => {
                    let db = tmp.path().join(format!("{}.sqlite", format.name()));
                    let url = format!("sqlite://{}", db.display());
                    let r = ingest(&file, format, &url, args.n, tmp.path(), backend);
                    for suffix in ["", "-wal", "-shm"] {
                        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
                    }
                    r?
                }
                Backend::Postgres => {
                    let admin = pg_admin.as_deref().context("no PostgreSQL URL")?;
                    let name = format!("tooltune_bench_{}_{}", std::process::id(), format.name());
                    runtime.block_on(pg_exec(admin, &format!("CREATE DATABASE {name}")))?;
                    let r = ingest(
                        &file,
                        format,
                        &with_database(admin, &name),
                        args.n,
                        tmp.path(),
                        backend,
                    );
                    runtime.block_on(pg_exec(
                        admin,
                        &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
                    ))?;
                    r?
                }
            };
            let row = Row { file_mb, ..row };
            println!(
                "  {:<9} {:<9} {:>8} {:>8.2} s {:>9.0} trajectories/s {:>7.1} MiB peak RSS",
                format.name(),
                row.backend,
                row.n,
                row.seconds,
                row.n as f64 / row.seconds,
                row.peak_rss_mb
            );
            rows.push(row);
        }
        // The files are large (several GB at a million records); keep only one on disk at a time.
        if !args.keep {
            std::fs::remove_file(&file)?;
        }
    }
    print_table(&rows);
    if !phases.is_empty() {
        println!();
        println!(
            "| format | parse only s | parse only trajectories/s | parse + ids + body s | parse + ids + body trajectories/s |"
        );
        println!("|---|---:|---:|---:|---:|");
        for (format, [parse, prepare]) in phases {
            println!(
                "| {format} | {parse:.2} | {:.0} | {prepare:.2} | {:.0} |",
                args.n as f64 / parse,
                args.n as f64 / prepare
            );
        }
    }
    Ok(())
}

fn print_table(rows: &[Row]) {
    println!();
    println!("| format | backend | N | seconds | trajectories/s | peak RSS MiB | file MB |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {} | {} | {:.2} | {:.0} | {:.1} | {:.0} |",
            r.format.name(),
            r.backend,
            r.n,
            r.seconds,
            r.n as f64 / r.seconds,
            r.peak_rss_mb,
            r.file_mb
        );
    }
}

/// Runs `tooltune ingest` on one file and store, measuring wall time and the child's peak RSS, and checks that
/// its report says every record was added.
fn ingest(
    file: &Path,
    format: Format,
    url: &str,
    n: u64,
    tmp: &Path,
    backend: Backend,
) -> Result<Row> {
    let log = tmp.join(format!("{}-{}.stderr", format.name(), backend.name()));
    // Earlier work (the generated file, the previous ingest's database) leaves dirty pages that the kernel would
    // write back during this ingest; flush them first so each figure measures only its own ingest's writes.
    let _ = Command::new("sync").status();
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tooltune"))
        .arg("--database-url")
        .arg(url)
        .args(["ingest", "--json", "--format", format.name()])
        .arg(file)
        .env_remove("TOOLTUNE_DATABASE_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(File::create(&log)?)
        .spawn()
        .context("starting tooltune")?;
    let mut out = String::new();
    child
        .stdout
        .take()
        .context("the child's stdout")?
        .read_to_string(&mut out)?;
    let (status, max_rss_kb) = wait_with_peak_rss(child.id())?;
    let seconds = started.elapsed().as_secs_f64();
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    ensure!(
        status.success(),
        "{format} into {}: tooltune ingest failed ({status}):\n{stderr}\n{out}",
        backend.name()
    );
    let report: Value = serde_json::from_str(&out)
        .with_context(|| format!("{format}: the ingest's --json output is not JSON:\n{out}"))?;
    let file_report = &report["files"][0]["report"];
    let added = file_report["added"].as_u64();
    let records = file_report["records"].as_u64();
    ensure!(
        report["ok"] == json!(true) && added == Some(n) && records == Some(n),
        "{format} into {}: expected {n} records all added, the report says {}",
        backend.name(),
        report["files"][0]
    );
    Ok(Row {
        format,
        backend: backend.name(),
        n,
        seconds,
        peak_rss_mb: max_rss_kb as f64 / 1024.0,
        file_mb: 0.0,
    })
}

/// Reaps the child with `wait4`, which also returns its resource usage: `ru_maxrss` is the peak resident set
/// in KiB, exact, where polling `/proc/PID/status` could miss a peak between two polls.
#[allow(unsafe_code)] // The workspace denies unsafe code; wait4 has no safe wrapper in std.
fn wait_with_peak_rss(pid: u32) -> Result<(ExitStatus, i64)> {
    let pid = libc::pid_t::try_from(pid).context("child pid out of range")?;
    let mut status: libc::c_int = 0;
    // SAFETY: `rusage` is plain old data (integers and timevals); all-zero is a valid value of it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `pid` is our own child, not yet reaped (std's `Child::wait` is never called on it), and both
        // pointers point at live locals of the right types.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == pid {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e).context("waiting for tooltune");
        }
    }
    Ok((ExitStatus::from_raw(status), usage.ru_maxrss))
}

/// Times `ChunkReader` over a file: the parse phase of an ingest without any database work; with `prepare`, also
/// what the store computes per trajectory before any SQL (`tooltune_store::PrepareOnly`, the store's own code: ids,
/// JSON body compressed as for SQLite, description versions), to show the ceiling the CPU side sets.
fn parse_only(file: &Path, format: Format, prepare: bool) -> Result<(f64, u64)> {
    let started = Instant::now();
    let mut reader = ChunkReader::open(file, FormatChoice::Fixed(format), ReadOptions::default())?;
    let mut valid = 0;
    let mut prepare_only = tooltune_store::PrepareOnly::new(true);
    while let Some(chunk) = reader.next_chunk()? {
        let mut good = Vec::with_capacity(chunk.len());
        for p in chunk {
            match p.result {
                Ok(t) => good.push(t),
                Err(e) => bail!("{}: {e}", file.display()),
            }
        }
        valid += good.len() as u64;
        if prepare {
            let bytes = prepare_only.chunk(&good);
            std::hint::black_box(bytes);
        }
    }
    Ok((started.elapsed().as_secs_f64(), valid))
}

async fn pg_exec(admin_url: &str, sql: &str) -> Result<()> {
    use sqlx::Connection;
    let mut conn = sqlx::postgres::PgConnection::connect(admin_url)
        .await
        .with_context(|| format!("connecting to {}", tooltune_store::redact_url(admin_url)))?;
    sqlx::query(sql)
        .execute(&mut conn)
        .await
        .with_context(|| format!("PostgreSQL: {sql}"))?;
    conn.close().await?;
    Ok(())
}

/// The server URL with its database path replaced by `db` (query parameters kept).
fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (url, String::new()),
    };
    let after_scheme = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[after_scheme..]
        .find('/')
        .map_or(base.len(), |i| after_scheme + i);
    format!("{}/{db}{query}", &base[..host_end])
}

// ---------------------------------------------------------------------------------------------------------------
// Synthetic trajectories.

/// splitmix64: a tiny, seedable generator; the same index gives the same trajectory in every format.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5851_F42D_4C95_7F2D)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.below(xs.len() as u64) as usize]
    }

    /// Plain prose of about `len` bytes, with numbers mixed in like real tool output.
    fn text(&mut self, len: usize) -> String {
        let mut s = String::with_capacity(len + 16);
        let mut words_in_sentence = 0;
        while s.len() < len {
            if !s.is_empty() {
                s.push(' ');
            }
            if self.below(6) == 0 {
                s.push_str(&self.below(100_000).to_string());
            } else {
                s.push_str(self.pick(WORDS));
            }
            words_in_sentence += 1;
            if words_in_sentence > 6 && self.below(4) == 0 {
                s.push('.');
                words_in_sentence = 0;
            }
        }
        s.push('.');
        s
    }

    fn hex(&mut self, digits: usize) -> String {
        let mut s = String::with_capacity(digits);
        while s.len() < digits {
            s.push_str(&format!("{:016x}", self.next()));
        }
        s.truncate(digits);
        s
    }
}

const WORDS: &[&str] = &[
    "invoice",
    "customer",
    "shipment",
    "pending",
    "region",
    "quarter",
    "total",
    "refund",
    "status",
    "warehouse",
    "ticket",
    "priority",
    "account",
    "balance",
    "order",
    "delivery",
    "report",
    "summary",
    "error",
    "timeout",
    "record",
    "updated",
    "created",
    "owner",
    "project",
    "budget",
    "estimate",
    "approved",
    "rejected",
    "review",
    "latency",
    "cluster",
    "node",
    "service",
    "version",
    "release",
    "branch",
    "commit",
    "file",
    "line",
    "query",
    "index",
    "table",
    "row",
    "value",
    "amount",
    "currency",
    "date",
    "week",
    "month",
    "team",
    "member",
    "schedule",
    "meeting",
    "room",
    "capacity",
    "forecast",
    "city",
    "route",
    "distance",
    "the",
    "of",
    "and",
    "for",
    "with",
    "was",
    "is",
    "in",
    "on",
    "by",
];

struct ToolDef {
    name: &'static str,
    description: &'static str,
    /// (property, JSON type, description)
    params: [(&'static str, &'static str, &'static str); 3],
}

/// Ten tools of an imaginary operations server; each trajectory is shown five of them.
const CATALOGUE: [ToolDef; 10] = [
    ToolDef {
        name: "search_orders",
        description: "Search the order database by customer, status or date range and return matching orders \
            with their id, customer, status, total and last update. Results are sorted by last update, newest \
            first. Use this before any tool that needs an order id; it never changes data.",
        params: [
            (
                "query",
                "string",
                "Free text matched against customer name, email and order notes.",
            ),
            (
                "status",
                "string",
                "One of pending, shipped, delivered, cancelled; omit for any status.",
            ),
            (
                "limit",
                "integer",
                "Maximum number of orders to return, 1 to 100; defaults to 20.",
            ),
        ],
    },
    ToolDef {
        name: "get_order",
        description: "Fetch one order by its id, with line items, shipping address, payment state and the full \
            status history. Returns an error when the id does not exist. Cheaper than search_orders when the \
            id is already known; read-only.",
        params: [
            (
                "order_id",
                "string",
                "The order id, as returned by search_orders (for example ord_83920).",
            ),
            (
                "include_items",
                "string",
                "Whether to include line items: yes or no; defaults to yes.",
            ),
            (
                "currency",
                "integer",
                "ISO 4217 numeric code to convert totals into; omit for the order currency.",
            ),
        ],
    },
    ToolDef {
        name: "issue_refund",
        description: "Refund all or part of a paid order to its original payment method. Refunds over the \
            order total are rejected. The refund is queued and normally settles within five business days; \
            the result contains the refund id and its state. This changes data: confirm the amount first.",
        params: [
            ("order_id", "string", "The order to refund."),
            (
                "amount_cents",
                "integer",
                "Amount to refund in the order currency's minor unit.",
            ),
            (
                "reason",
                "string",
                "Short reason shown to the customer on the refund notice.",
            ),
        ],
    },
    ToolDef {
        name: "track_shipment",
        description: "Return the carrier, tracking number, current location and estimated delivery date of a \
            shipment, with every scan event so far. Works for orders in shipped state only; for other states \
            it returns an error naming the state.",
        params: [
            ("order_id", "string", "The shipped order."),
            (
                "carrier",
                "string",
                "Carrier code to disambiguate split shipments; omit to use the first.",
            ),
            (
                "events",
                "integer",
                "How many most recent scan events to include; defaults to 10.",
            ),
        ],
    },
    ToolDef {
        name: "send_email",
        description: "Send a plain-text email to a customer from the support address. The message is logged \
            on the customer's record. Keep it short and factual; do not include payment details. Returns the \
            message id, or an error when the address bounced before.",
        params: [
            ("to", "string", "Recipient email address."),
            ("subject", "string", "Subject line, at most 120 characters."),
            ("body", "string", "Plain-text body."),
        ],
    },
    ToolDef {
        name: "read_file",
        description: "Read a UTF-8 text file from the shared workspace and return its contents, up to 1 MiB. \
            Paths are relative to the workspace root; parent directory components are rejected. Binary files \
            return an error. Use list_files first when the exact name is unknown.",
        params: [
            ("path", "string", "Path relative to the workspace root."),
            (
                "offset",
                "integer",
                "Byte offset to start reading from; defaults to 0.",
            ),
            (
                "encoding",
                "string",
                "Text encoding; only utf-8 is supported.",
            ),
        ],
    },
    ToolDef {
        name: "list_files",
        description: "List the files and folders under a workspace directory with their sizes and modification \
            times, optionally filtered by a glob pattern. Does not recurse unless asked. Hidden files are \
            included. Read-only and fast; prefer it to guessing file names.",
        params: [
            (
                "dir",
                "string",
                "Directory relative to the workspace root; empty for the root.",
            ),
            (
                "pattern",
                "string",
                "Glob such as *.csv; omit for every entry.",
            ),
            (
                "depth",
                "integer",
                "How many levels to descend, 1 to 5; defaults to 1.",
            ),
        ],
    },
    ToolDef {
        name: "calculator",
        description: "Evaluate an arithmetic expression exactly, with + - * / % and parentheses, integers and \
            decimals. Returns the value as a decimal string. Use it for any sum or product over more than two \
            numbers instead of doing arithmetic in your head; it has no side effects.",
        params: [
            (
                "expression",
                "string",
                "For example (48000 + 9500) * 1.2 - 12000.",
            ),
            (
                "precision",
                "integer",
                "Decimal places in the result; defaults to 2.",
            ),
            (
                "rounding",
                "string",
                "half_up or half_even; defaults to half_even.",
            ),
        ],
    },
    ToolDef {
        name: "create_ticket",
        description: "Open a support ticket for a customer problem that cannot be solved in this conversation, \
            assigned to the team that owns the topic. Returns the ticket id and the expected response time. \
            Do not open a ticket for questions the other tools can answer.",
        params: [
            ("title", "string", "One-line summary of the problem."),
            ("priority", "integer", "1 (urgent) to 4 (low)."),
            (
                "details",
                "string",
                "What happened, what was tried, and the order ids involved.",
            ),
        ],
    },
    ToolDef {
        name: "weather_forecast",
        description: "Return the hourly temperature, precipitation probability and wind for a city for the next \
            72 hours, from the national weather service. Useful for delivery planning. City names are matched \
            loosely; the result names the city that was actually used.",
        params: [
            (
                "city",
                "string",
                "City name, optionally with country (Lyon, FR).",
            ),
            (
                "hours",
                "integer",
                "How many hours ahead, 1 to 72; defaults to 24.",
            ),
            ("units", "string", "metric or imperial; defaults to metric."),
        ],
    },
];

/// Extra sentences that make up different description versions of the same tool (as an optimiser would try).
const REVISIONS: [&str; 3] = [
    "",
    " Only call it when the user's request needs it; results are authoritative and current.",
    " When it returns an error, read the message: it says which argument to fix before retrying.",
];

const SYSTEM: &str = "You are the operations assistant of a small online shop. Use the tools to look things up \
    instead of guessing, keep answers short, and say which records you used. Never invent order ids.";

/// Start offsets and durations (ms) of the three model turns and the three tool results.
const MODEL_TIMES: [(u64, u64); 3] = [(4, 610), (700, 690), (1500, 720)];
const RESULT_TIMES: [(u64, u64); 3] = [(620, 60), (1400, 45), (1410, 70)];

struct Tool {
    name: &'static str,
    description: String,
    schema: Value,
}

struct Call {
    id: String,
    /// Index into the shown tools.
    tool: usize,
    args: Value,
    result: String,
    is_error: bool,
}

/// One trajectory, independent of format.
struct Scenario {
    i: u64,
    task: String,
    tools: Vec<Tool>,
    calls: [Call; 3],
    final_answer: String,
    score: f64,
    feedback: Option<String>,
    trace_id: String,
    start_ms: u64,
    /// (prompt, completion) tokens of each model turn.
    usage: [(u64, u64); 3],
}

impl Scenario {
    fn new(i: u64) -> Scenario {
        let mut rng = Rng::new(i);
        let first = (i % CATALOGUE.len() as u64) as usize;
        let revision = ((i / CATALOGUE.len() as u64) % REVISIONS.len() as u64) as usize;
        let tools: Vec<Tool> = (0..5)
            .map(|k| {
                let def = &CATALOGUE[(first + k * 2) % CATALOGUE.len()];
                let mut props = serde_json::Map::new();
                for (name, ty, desc) in def.params {
                    props.insert(name.into(), json!({"type": ty, "description": desc}));
                }
                Tool {
                    name: def.name,
                    description: format!("{}{}", def.description, REVISIONS[revision]),
                    schema: json!({
                        "type": "object",
                        "properties": props,
                        "required": [def.params[0].0],
                    }),
                }
            })
            .collect();
        // Three of the five shown tools are called, in a varying order.
        let order = [
            (i % 5) as usize,
            ((i + 1) % 5) as usize,
            ((i + 3) % 5) as usize,
        ];
        let calls = order.map(|t| {
            let def = CATALOGUE
                .iter()
                .find(|d| d.name == tools[t].name)
                .map(|d| d.params)
                .unwrap_or(CATALOGUE[0].params);
            let mut args = serde_json::Map::new();
            for (name, ty, _) in def.iter().take(2) {
                let v = if *ty == "integer" {
                    json!(rng.below(100))
                } else {
                    json!(format!("{} {}", rng.pick(WORDS), rng.below(100_000)))
                };
                args.insert((*name).into(), v);
            }
            let is_error = rng.below(20) == 0;
            let len = 200 + rng.below(250) as usize;
            let result = if is_error {
                format!("error: {}", rng.text(120))
            } else {
                rng.text(len)
            };
            Call {
                id: format!("call_{}", rng.hex(24)),
                tool: t,
                args: Value::Object(args),
                result,
                is_error,
            }
        });
        let task_len = 90 + rng.below(80) as usize;
        let task = format!(
            "Request {i}: {} Then tell me what changed since last week.",
            capitalise(&rng.text(task_len))
        );
        let answer_len = 150 + rng.below(150) as usize;
        let final_answer = capitalise(&rng.text(answer_len));
        let score = rng.below(101) as f64 / 100.0;
        let feedback = (score < 0.5).then(|| format!("Grader: {}", rng.text(80)));
        let trace_id = format!("{i:016x}{}", rng.hex(16));
        let start_ms = 1_748_855_702_000 + i * 3_000;
        let usage = [
            (900 + rng.below(200), 20 + rng.below(30)),
            (1300 + rng.below(200), 40 + rng.below(40)),
            (2000 + rng.below(300), 60 + rng.below(80)),
        ];
        Scenario {
            i,
            task,
            tools,
            calls,
            final_answer,
            score,
            feedback,
            trace_id,
            start_ms,
            usage,
        }
    }

    fn success(&self) -> bool {
        self.score >= 0.5
    }

    fn tool_name(&self, c: &Call) -> &'static str {
        self.tools[c.tool].name
    }

    /// Which calls each model turn makes: one, then two in parallel, then none (the answer).
    fn turn_calls(&self, turn: usize) -> &[Call] {
        match turn {
            0 => &self.calls[..1],
            1 => &self.calls[1..],
            _ => &[],
        }
    }

    fn rfc3339(&self, offset_ms: u64) -> String {
        let ms = i64::try_from(self.start_ms + offset_ms).unwrap_or(i64::MAX);
        chrono::DateTime::from_timestamp_millis(ms)
            .unwrap_or_default()
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    }

    fn nanos(&self, offset_ms: u64) -> String {
        ((self.start_ms + offset_ms) as u128 * 1_000_000).to_string()
    }
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

/// Writes `n` records of `format` to `path`, one at a time (the bench's own memory stays flat).
fn generate(path: &Path, format: Format, n: u64) -> Result<()> {
    let mut w = BufWriter::with_capacity(1 << 20, File::create(path)?);
    for i in 0..n {
        let s = Scenario::new(i);
        let record = match format {
            Format::Tooltune => tooltune_record(&s),
            Format::OpenAi => openai_record(&s),
            Format::Langfuse => langfuse_record(&s),
            Format::Otel => otel_record(&s),
        };
        serde_json::to_writer(&mut w, &record)?;
        w.write_all(b"\n")?;
    }
    w.flush()?;
    Ok(())
}

/// tooltune: a step is one entry of `steps`: model (1 call), tool_result, model (2 calls), tool_result ×2,
/// model (the answer).
fn tooltune_record(s: &Scenario) -> Value {
    let mut steps = Vec::new();
    for (turn, &(at, dur)) in MODEL_TIMES.iter().enumerate() {
        let calls = s.turn_calls(turn);
        let mut step = json!({
            "type": "model",
            "timing": {"started_at": s.rfc3339(at), "duration_ms": dur as f64},
            "usage": {"prompt_tokens": s.usage[turn].0, "completion_tokens": s.usage[turn].1},
        });
        if calls.is_empty() {
            step["content"] = json!(s.final_answer);
        } else {
            step["tool_calls"] = calls
                .iter()
                .map(|c| json!({"id": c.id, "name": s.tool_name(c), "arguments": c.args}))
                .collect();
        }
        steps.push(step);
        for (k, c) in calls.iter().enumerate() {
            let idx = s.calls.iter().position(|x| x.id == c.id).unwrap_or(k);
            let (at, dur) = RESULT_TIMES[idx];
            steps.push(json!({
                "type": "tool_result", "call_id": c.id, "name": s.tool_name(c), "content": c.result,
                "is_error": c.is_error,
                "timing": {"started_at": s.rfc3339(at), "duration_ms": dur as f64},
            }));
        }
    }
    let mut outcome = json!({"score": s.score, "success": s.success()});
    if let Some(f) = &s.feedback {
        outcome["feedback"] = json!(f);
    }
    json!({
        "task": s.task,
        "system": SYSTEM,
        "tools": s.tools.iter().map(|t| json!({
            "name": t.name, "description": t.description, "input_schema": t.schema,
        })).collect::<Vec<_>>(),
        "steps": steps,
        "final_answer": s.final_answer,
        "outcome": outcome,
        "meta": {"model": "gpt-4o-mini-2024-07-18", "client": "shop-agent/1.4",
                 "external_id": format!("run-{:08}", s.i), "started_at": s.rfc3339(0)},
    })
}

fn openai_tool_calls(s: &Scenario, calls: &[Call]) -> Value {
    calls
        .iter()
        .map(|c| {
            json!({"id": c.id, "type": "function",
                   "function": {"name": s.tool_name(c), "arguments": c.args.to_string()}})
        })
        .collect()
}

/// The OpenAI chat history up to (not including) model turn `turn`.
fn openai_messages(s: &Scenario, turn: usize) -> Vec<Value> {
    let mut m = vec![
        json!({"role": "system", "content": SYSTEM}),
        json!({"role": "user", "content": s.task}),
    ];
    for t in 0..turn {
        let calls = s.turn_calls(t);
        m.push(json!({"role": "assistant", "content": null, "tool_calls": openai_tool_calls(s, calls)}));
        for c in calls {
            m.push(json!({"role": "tool", "tool_call_id": c.id, "content": c.result}));
        }
    }
    m
}

fn openai_tools(s: &Scenario) -> Vec<Value> {
    s.tools
        .iter()
        .map(|t| {
            json!({"type": "function",
                   "function": {"name": t.name, "description": t.description, "parameters": t.schema}})
        })
        .collect()
}

/// openai: the request of the final turn. A step is one later message: assistant (1 call), tool, assistant
/// (2 calls), tool ×2, and `response.choices[0].message` (the answer). The chat format cannot mark a tool result
/// as failed, so every result has `is_error` false here.
fn openai_record(s: &Scenario) -> Value {
    let mut r = json!({
        "model": "gpt-4o-mini",
        "messages": openai_messages(s, 2),
        "tools": openai_tools(s),
        "tool_choice": "auto",
        "temperature": 0,
        "response": {
            "id": format!("chatcmpl-{}", &s.trace_id[..29]),
            "object": "chat.completion",
            "created": (s.start_ms + MODEL_TIMES[2].0) / 1000,
            "model": "gpt-4o-mini-2024-07-18",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": s.final_answer, "refusal": null,
                         "annotations": []}, "logprobs": null, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": s.usage[2].0, "completion_tokens": s.usage[2].1,
                      "total_tokens": s.usage[2].0 + s.usage[2].1},
            "service_tier": "default",
            "system_fingerprint": "fp_0143825b4c",
        },
        "score": s.score,
        "success": s.success(),
    });
    if let Some(f) = &s.feedback {
        r["feedback"] = json!(f);
    }
    r
}

/// langfuse: the trace as the public API returns it. A step is one observation: GENERATION (1 call), TOOL,
/// GENERATION (2 calls), TOOL ×2, GENERATION (the answer); the AGENT observation around them is not a step.
fn langfuse_record(s: &Scenario) -> Value {
    let root_id = s.trace_id[..16].to_string();
    let mut rng = Rng::new(s.i ^ 0xABCD);
    let end = MODEL_TIMES[2].0 + MODEL_TIMES[2].1;
    let observation = |kind: &str, name: &str, at: u64, dur: u64, id: String| {
        json!({
            "id": id, "traceId": s.trace_id, "type": kind, "name": name,
            "startTime": s.rfc3339(at), "endTime": s.rfc3339(at + dur),
            "completionStartTime": null, "model": null, "modelParameters": null, "input": null, "version": null,
            "metadata": {}, "output": null,
            "usage": {"input": 0, "output": 0, "total": 0, "unit": "TOKENS"},
            "level": "DEFAULT", "statusMessage": null,
            "parentObservationId": if kind == "AGENT" { Value::Null } else { json!(root_id) },
            "promptId": null, "usageDetails": {}, "costDetails": {}, "environment": "default",
            "latency": dur as f64 / 1000.0,
        })
    };
    let mut root = observation("AGENT", "shop-agent", 0, end, root_id.clone());
    root["input"] = json!(s.task);
    root["output"] = json!(s.final_answer);
    let mut obs = vec![root];
    for (turn, &(at, dur)) in MODEL_TIMES.iter().enumerate() {
        let calls = s.turn_calls(turn);
        let mut g = observation("GENERATION", "OpenAI-generation", at, dur, rng.hex(16));
        g["completionStartTime"] = json!(s.rfc3339(at + 200));
        g["model"] = json!("gpt-4o-mini-2024-07-18");
        g["modelParameters"] = json!({"temperature": 0, "tool_choice": "auto"});
        g["metadata"] = json!({"ls_provider": "openai"});
        g["input"] = json!({"tools": openai_tools(s), "messages": openai_messages(s, turn)});
        g["output"] = if calls.is_empty() {
            json!({"role": "assistant", "content": s.final_answer})
        } else {
            json!({"role": "assistant", "content": null, "tool_calls": openai_tool_calls(s, calls)})
        };
        let (p, c) = s.usage[turn];
        g["usage"] = json!({"input": p, "output": c, "total": p + c, "unit": "TOKENS"});
        g["usageDetails"] = json!({"input": p, "output": c, "total": p + c});
        g["timeToFirstToken"] = json!(0.2);
        obs.push(g);
        for c in calls {
            let idx = s.calls.iter().position(|x| x.id == c.id).unwrap_or(0);
            let (at, dur) = RESULT_TIMES[idx];
            let mut t = observation("TOOL", s.tool_name(c), at, dur, rng.hex(16));
            t["input"] = c.args.clone();
            t["output"] = json!(c.result);
            if c.is_error {
                t["level"] = json!("ERROR");
                t["statusMessage"] = json!("tool raised an error");
            }
            obs.push(t);
        }
    }
    let score_at = s.rfc3339(end + 5_000);
    let mut score = |name: &str, source: &str, data_type: &str, value: Value| {
        json!({
            "id": rng.hex(24), "traceId": s.trace_id, "name": name, "source": source, "observationId": null,
            "timestamp": score_at, "createdAt": score_at, "updatedAt": score_at, "authorUserId": null,
            "comment": null, "configId": null, "queueId": null, "environment": "default",
            "dataType": data_type, "value": value,
        })
    };
    let mut correctness = score("correctness", "EVAL", "NUMERIC", json!(s.score));
    if let Some(f) = &s.feedback {
        correctness["comment"] = json!(f);
    }
    let mut success = score(
        "task_success",
        "API",
        "BOOLEAN",
        json!(i32::from(s.success())),
    );
    success["stringValue"] = json!(if s.success() { "True" } else { "False" });
    json!({
        "id": s.trace_id, "timestamp": s.rfc3339(0), "name": "shop-agent",
        "input": s.task, "output": s.final_answer,
        "sessionId": format!("session-{}", s.i / 4), "release": "1.4.0", "version": null,
        "userId": format!("user-{}", s.i % 977), "metadata": {"agent_version": "1.4.0"}, "tags": ["shop-agent"],
        "public": false, "environment": "default",
        "htmlPath": format!("/project/cm0shopagent/traces/{}", s.trace_id),
        "latency": end as f64 / 1000.0, "totalCost": 0.0021,
        "observations": obs,
        "scores": [correctness, success],
    })
}

fn kv(key: &str, value: Value) -> Value {
    json!({"key": key, "value": value})
}

fn sv(key: &str, v: impl Into<String>) -> Value {
    kv(key, json!({"stringValue": v.into()}))
}

/// GenAI-convention messages (`parts`) up to model turn `turn`, without the system instructions.
fn otel_messages(s: &Scenario, turn: usize) -> Vec<Value> {
    let mut m = vec![json!({"role": "user", "parts": [{"type": "text", "content": s.task}]})];
    for t in 0..turn {
        let calls = s.turn_calls(t);
        m.push(
            json!({"role": "assistant", "parts": calls.iter().map(|c| json!({
            "type": "tool_call", "id": c.id, "name": s.tool_name(c), "arguments": c.args,
        })).collect::<Vec<_>>()}),
        );
        for c in calls {
            m.push(
                json!({"role": "tool", "parts": [{"type": "tool_call_response", "id": c.id,
                                                     "response": c.result}]}),
            );
        }
    }
    m
}

/// otel: one OTLP/JSON request per trace, as the collector's file exporter writes a batch. A step is one span:
/// chat (1 call), execute_tool, chat (2 calls), execute_tool ×2, chat (the answer); the invoke_agent root span
/// carries the outcome and is not a step.
fn otel_record(s: &Scenario) -> Value {
    let mut rng = Rng::new(s.i ^ 0x0123_4567);
    let root_id = rng.hex(16);
    let end = MODEL_TIMES[2].0 + MODEL_TIMES[2].1;
    let definitions = serde_json::to_string(
        &s.tools
            .iter()
            .map(|t| {
                json!({"type": "function", "name": t.name, "description": t.description,
                             "parameters": t.schema})
            })
            .collect::<Vec<_>>(),
    )
    .unwrap_or_default();
    let instructions = json!([{"type": "text", "content": SYSTEM}]).to_string();
    let span = |name: String,
                kind: u8,
                at: u64,
                dur: u64,
                id: String,
                parent: &str,
                attrs: Vec<Value>| {
        json!({
            "traceId": s.trace_id, "spanId": id, "parentSpanId": parent, "flags": 257, "name": name,
            "kind": kind, "startTimeUnixNano": s.nanos(at), "endTimeUnixNano": s.nanos(at + dur),
            "attributes": attrs, "status": {},
        })
    };
    let mut chats = Vec::new();
    let mut tools = Vec::new();
    for (turn, &(at, dur)) in MODEL_TIMES.iter().enumerate() {
        let calls = s.turn_calls(turn);
        let (finish, parts) = if calls.is_empty() {
            (
                "stop",
                vec![json!({"type": "text", "content": s.final_answer})],
            )
        } else {
            (
                "tool_call",
                calls
                    .iter()
                    .map(|c| json!({"type": "tool_call", "id": c.id, "name": s.tool_name(c), "arguments": c.args}))
                    .collect(),
            )
        };
        let output =
            json!([{"role": "assistant", "parts": parts, "finish_reason": finish}]).to_string();
        let attrs = vec![
            sv("gen_ai.operation.name", "chat"),
            sv("gen_ai.provider.name", "openai"),
            sv("gen_ai.request.model", "gpt-4o-mini"),
            kv("gen_ai.request.temperature", json!({"doubleValue": 0.0})),
            sv("server.address", "api.openai.com"),
            kv("server.port", json!({"intValue": "443"})),
            sv("gen_ai.response.model", "gpt-4o-mini-2024-07-18"),
            sv("gen_ai.response.id", format!("chatcmpl-{}", rng.hex(29))),
            kv(
                "gen_ai.response.finish_reasons",
                json!({"arrayValue": {"values": [{"stringValue": finish}]}}),
            ),
            kv(
                "gen_ai.usage.input_tokens",
                json!({"intValue": s.usage[turn].0.to_string()}),
            ),
            kv(
                "gen_ai.usage.output_tokens",
                json!({"intValue": s.usage[turn].1.to_string()}),
            ),
            sv("gen_ai.system_instructions", instructions.clone()),
            sv(
                "gen_ai.input.messages",
                serde_json::to_string(&otel_messages(s, turn)).unwrap_or_default(),
            ),
            sv("gen_ai.output.messages", output),
            sv("gen_ai.tool.definitions", definitions.clone()),
        ];
        chats.push(span(
            "chat gpt-4o-mini".into(),
            3,
            at,
            dur,
            rng.hex(16),
            &root_id,
            attrs,
        ));
        for c in calls {
            let idx = s.calls.iter().position(|x| x.id == c.id).unwrap_or(0);
            let (at, dur) = RESULT_TIMES[idx];
            let name = s.tool_name(c);
            let mut attrs = vec![
                sv("gen_ai.operation.name", "execute_tool"),
                sv("gen_ai.tool.name", name),
                sv("gen_ai.tool.call.id", c.id.clone()),
                sv("gen_ai.tool.type", "function"),
                sv("gen_ai.tool.call.arguments", c.args.to_string()),
                sv("gen_ai.tool.call.result", c.result.clone()),
            ];
            let mut sp = span(
                format!("execute_tool {name}"),
                1,
                at,
                dur,
                rng.hex(16),
                &root_id,
                vec![],
            );
            if c.is_error {
                attrs.push(sv("error.type", "ToolError"));
                sp["status"] = json!({"code": 2, "message": "tool raised an error"});
            }
            sp["attributes"] = Value::Array(attrs);
            tools.push(sp);
        }
    }
    let mut root_attrs = vec![
        sv("gen_ai.operation.name", "invoke_agent"),
        sv("gen_ai.provider.name", "openai"),
        sv("gen_ai.agent.name", "shop-agent"),
        sv("gen_ai.request.model", "gpt-4o-mini"),
        kv("tooltune.outcome.score", json!({"doubleValue": s.score})),
        kv(
            "tooltune.outcome.success",
            json!({"boolValue": s.success()}),
        ),
    ];
    if let Some(f) = &s.feedback {
        root_attrs.push(sv("tooltune.outcome.feedback", f.clone()));
    }
    // The root ends last, so an exporter sends it after its children.
    tools.push(span(
        "invoke_agent shop-agent".into(),
        1,
        0,
        end,
        root_id.clone(),
        "",
        root_attrs,
    ));
    json!({"resourceSpans": [{
        "resource": {"attributes": [
            sv("service.name", "shop-agent"), sv("service.version", "1.4.0"),
            sv("telemetry.sdk.language", "python"), sv("telemetry.sdk.name", "opentelemetry"),
            sv("telemetry.sdk.version", "1.36.0"),
        ]},
        "scopeSpans": [
            {"scope": {"name": "opentelemetry.instrumentation.openai_v2", "version": "2.1b0"}, "spans": chats},
            {"scope": {"name": "shop_agent", "version": "1.4.0"}, "spans": tools},
        ],
    }]})
}

//! `tooltune proxy`: run an MCP server behind tooltune, so that hosts see chosen descriptions (one set, or A/B
//! variants) and every session's tool calls are recorded in the trace store.

use crate::search_args::parse_overrides;
use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tooltune_proxy::record::Recorder;
use tooltune_proxy::stdio::{self, StdioOptions};
use tooltune_proxy::{RecordMode, SessionConfig, Variant, assign};
use tooltune_store::{NewProxySession, Store};

/// Arguments of `tooltune proxy`.
#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// Descriptions to show, as written by `optimize --export` (a JSON object of tool name to description).
    #[arg(long = "overrides", value_name = "FILE", conflicts_with_all = ["run", "variants"])]
    overrides: Option<PathBuf>,
    /// Show the winner of this optimisation run (its id, as `optimize` and the dashboard print it).
    #[arg(long, value_name = "RUN", conflicts_with = "variants")]
    run: Option<String>,
    /// An A/B variant, NAME=FILE (FILE as for --overrides; `NAME=-` shows the server's own texts). Give two or
    /// more; each session is assigned one, recorded with it.
    #[arg(long = "variant", value_name = "NAME=FILE")]
    variants: Vec<String>,
    /// Weights of the variants, in order, comma-separated [default: equal]
    #[arg(long, value_delimiter = ',', requires = "variants")]
    weights: Vec<f64>,
    /// The key a session's variant is drawn from: the same key always gets the same variant. Stdio has no
    /// session id, so a host that wants a stable assignment across restarts passes one [default: random per
    /// session]
    #[arg(long, env = "TOOLTUNE_PROXY_SESSION_KEY")]
    session_key: Option<String>,
    /// What is recorded: none, calls (tool, description version, arguments, error, latency) or full (also results)
    #[arg(long, default_value = "calls", value_parser = ["none", "calls", "full"])]
    record: String,
    /// An argument key whose values are never stored (any depth); repeat for several
    #[arg(long = "redact", value_name = "KEY")]
    redact: Vec<String>,
    /// Answer a request with an error when the server has not answered it after this many seconds
    #[arg(long, value_name = "SECS")]
    request_timeout: Option<f64>,
    /// Do not check at start-up that the server offers the tools named (stdio: the server is started once and
    /// asked; HTTP: the proxy initializes a session with the upstream, lists its tools and ends the session)
    #[arg(long)]
    no_check: bool,
    /// Serve Streamable HTTP at this address instead of stdio (with --upstream); a non-loopback address needs
    /// TOOLTUNE_PROXY_TOKEN, which hosts then send as a bearer token. Port 0 picks a free port; the URL is printed
    #[arg(long, requires = "upstream", value_name = "ADDR")]
    listen: Option<std::net::SocketAddr>,
    /// The upstream server's Streamable HTTP endpoint (with --listen)
    #[arg(long, requires = "listen", value_name = "URL")]
    upstream: Option<String>,
    /// The name of an environment variable holding a bearer token for the upstream
    #[arg(long, requires = "upstream", value_name = "NAME")]
    upstream_token_env: Option<String>,
    /// The server's command and arguments, after `--` (stdio)
    #[arg(
        last = true,
        required_unless_present = "upstream",
        value_name = "COMMAND"
    )]
    command: Vec<String>,
}

fn read_variant(spec: &str) -> Result<Variant> {
    let Some((name, file)) = spec.split_once('=') else {
        bail!("--variant {spec:?}: expected NAME=FILE");
    };
    if name.trim().is_empty() {
        bail!("--variant {spec:?}: the name is empty");
    }
    let rewrites = if file == "-" {
        BTreeMap::new()
    } else {
        parse_overrides(&[], Some(std::path::Path::new(file)))
            .with_context(|| format!("--variant {name}"))?
    };
    Ok(Variant {
        name: name.trim().to_string(),
        rewrites,
    })
}

async fn winner_of(db: &str, run: &str) -> Result<BTreeMap<String, String>> {
    let store = Store::open(db).await?;
    let Some(row) = store.run(run).await? else {
        bail!("--run {run}: no such run in the store (`tooltune serve` lists runs)");
    };
    let Some(result) = row.result.as_deref() else {
        bail!(
            "--run {run}: the run has no result yet (status {}); resume or wait for it",
            row.status
        );
    };
    let v: Value = serde_json::from_str(result).context("reading the run's result")?;
    let map: BTreeMap<String, String> =
        serde_json::from_value(v.get("winner_descriptions").cloned().unwrap_or(Value::Null))
            .with_context(|| format!("--run {run}: the result has no winner_descriptions"))?;
    Ok(map)
}

pub async fn run(db: &str, args: ProxyArgs) -> Result<ExitCode> {
    let variants: Vec<Variant> = if !args.variants.is_empty() {
        if args.variants.len() < 2 {
            bail!("--variant: give two or more (or use --overrides for one set of descriptions)");
        }
        let v = args
            .variants
            .iter()
            .map(|s| read_variant(s))
            .collect::<Result<Vec<_>>>()?;
        let mut names: Vec<&str> = v.iter().map(|x| x.name.as_str()).collect();
        names.sort();
        names.dedup();
        if names.len() != v.len() {
            bail!("--variant: two variants have the same name");
        }
        v
    } else {
        let rewrites = match (&args.overrides, &args.run) {
            (Some(f), _) => parse_overrides(&[], Some(f))?,
            (None, Some(r)) => winner_of(db, r).await?,
            (None, None) => BTreeMap::new(),
        };
        vec![Variant {
            name: String::new(),
            rewrites,
        }]
    };
    let weights = if args.weights.is_empty() {
        vec![1.0; variants.len()]
    } else {
        if args.weights.len() != variants.len() {
            bail!(
                "--weights: {} weights for {} variants",
                args.weights.len(),
                variants.len()
            );
        }
        if args.weights.iter().any(|w| !w.is_finite() || *w < 0.0)
            || args.weights.iter().all(|w| *w == 0.0)
        {
            bail!("--weights: each must be a number >= 0, and one > 0");
        }
        args.weights.clone()
    };
    let record = match args.record.as_str() {
        "none" => RecordMode::None,
        "full" => RecordMode::Full,
        _ => RecordMode::Calls,
    };
    let upstream_token = match &args.upstream_token_env {
        Some(name) => Some(
            std::env::var(name)
                .with_context(|| format!("--upstream-token-env {name}: the variable is not set"))?,
        ),
        None => None,
    };
    // The names to rewrite are checked against the server's tools before any host connects, over both transports.
    if !args.no_check && variants.iter().any(|v| !v.rewrites.is_empty()) {
        let (server, offered) = match &args.upstream {
            Some(url) => (
                tooltune_proxy::http::upstream_name(url),
                tooltune_proxy::http::list_tools(
                    url,
                    upstream_token.as_deref(),
                    Duration::from_secs(60),
                )
                .await?,
            ),
            None => (
                stdio::server_name(&args.command),
                stdio::list_tools(&args.command, Duration::from_secs(60)).await?,
            ),
        };
        let missing = tooltune_proxy::missing_tools(&variants, &offered);
        if !missing.is_empty() {
            return Err(tooltune_proxy::ProxyError::UnknownTools {
                server,
                missing,
                offered,
            }
            .into());
        }
    }
    if let (Some(listen), Some(upstream)) = (args.listen, args.upstream.clone()) {
        // Tokens come from the environment only, so that they never appear in a process list or shell history.
        let token = std::env::var("TOOLTUNE_PROXY_TOKEN")
            .ok()
            .filter(|t| !t.is_empty());
        let options = tooltune_proxy::http::HttpOptions {
            upstream,
            variants,
            weights,
            record,
            redact: args.redact,
            token,
            upstream_token,
        };
        return serve_http(db, listen, options).await;
    }
    let session_id = uuid::Uuid::new_v4().to_string();
    let key = args
        .session_key
        .clone()
        .unwrap_or_else(|| session_id.clone());
    let chosen = variants[assign(&key, &weights)].clone();
    let (recorder, writer) = if record == RecordMode::None {
        (None, None)
    } else {
        let store = Store::open(db).await?;
        let (r, w) = Recorder::start(
            store,
            NewProxySession {
                id: session_id.clone(),
                server: stdio::server_name(&args.command),
                variant: chosen.name.clone(),
            },
        )
        .await?;
        (Some(r), Some(w))
    };
    tracing::info!(session = %session_id, variant = %chosen.name, "proxying");
    let options = StdioOptions {
        session: SessionConfig {
            rewrites: chosen.rewrites,
            record,
            redact: args.redact.clone(),
        },
        request_timeout: args
            .request_timeout
            .filter(|s| s.is_finite() && *s > 0.0)
            .map(Duration::from_secs_f64),
    };
    let ended = stdio::run(
        &args.command,
        options,
        recorder,
        tokio::io::stdin(),
        tokio::io::stdout(),
    )
    .await?;
    if let Some(w) = writer {
        let dropped = w.finish().await?;
        if dropped > 0 {
            eprintln!(
                "tooltune proxy: {dropped} event(s) of session {session_id} were not recorded (the store fell behind)"
            );
        }
    }
    if ended.failed_for_the_server > 0 {
        eprintln!(
            "tooltune proxy: {} request(s) answered with an error because the server could not ({})",
            ended.failed_for_the_server,
            ended.server_exit.as_deref().unwrap_or("stopped")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `--listen ADDR --upstream URL`: serves until Ctrl-C, then stores what was recorded.
async fn serve_http(
    db: &str,
    listen: std::net::SocketAddr,
    options: tooltune_proxy::http::HttpOptions,
) -> Result<ExitCode> {
    let store = match options.record {
        RecordMode::None => None,
        _ => Some(Store::open(db).await?),
    };
    let proxy = tooltune_proxy::http::HttpProxy::start(listen, options, store).await?;
    // Ctrl-C is listened for before the URL is announced (see `Interrupts`).
    let mut interrupts = crate::progress::Interrupts::listen().context("listening for Ctrl-C")?;
    // The first line on stdout is the URL, so that a script that asked for port 0 can read it.
    println!("http://{}/mcp", proxy.local_addr());
    eprintln!(
        "tooltune proxy: listening on http://{}/mcp; Ctrl-C stops",
        proxy.local_addr()
    );
    interrupts.next().await;
    proxy.shutdown().await?;
    Ok(ExitCode::SUCCESS)
}

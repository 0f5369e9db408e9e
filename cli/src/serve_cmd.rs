//! `tooltune serve`: the web service (JSON API, server-sent progress events, dashboard pages) over the trace store,
//! with optimisation runs as jobs in this process. Stopping it (Ctrl-C) leaves unfinished runs resumable; the next
//! `serve` on the same store resumes them.

use anyhow::{Context, Result};
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use tooltune_store::Store;
use tooltune_web::{ServeConfig, Server, Token};

/// Arguments of `tooltune serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on; port 0 picks a free one. A non-loopback address needs TOOLTUNE_TOKEN.
    #[arg(long, default_value = "127.0.0.1:8640")]
    bind: SocketAddr,
    /// The folder of task suites that runs may use (a run names a suite by file name without `.toml`).
    #[arg(long, default_value = "datasets/suites")]
    suites: PathBuf,
    /// A model runs may use (repeat for several; the first is the default): local, local:fast or
    /// openai:MODEL@BASE_URL. Only these are accepted, because a model decides where an API key is sent.
    #[arg(long = "model", default_values_t = ["local".to_string(), "local:fast".to_string()])]
    models: Vec<String>,
    /// Environment variable holding the API key of OpenAI-compatible models.
    #[arg(long)]
    api_key_env: Option<String>,
    /// Largest `POST /api/traces` body, in MiB.
    #[arg(long, default_value_t = 32)]
    max_trace_mib: usize,
    /// Runs executing at once; others wait in a queue.
    #[arg(long, default_value_t = 1)]
    max_jobs: usize,
    /// Do not resume the runs the store lists as unfinished (for example while the CLI drives one).
    #[arg(long)]
    no_resume: bool,
}

pub async fn run(db: &str, args: ServeArgs) -> Result<ExitCode> {
    // The token is read from the environment only, so that it never appears in a process list or shell history.
    let token = Token::from_env("TOOLTUNE_TOKEN")?;
    let store = Store::open(db).await?;
    let mut cfg = ServeConfig::new(args.bind);
    cfg.token = token;
    cfg.suites_dir = args.suites;
    cfg.models = args.models;
    cfg.api_key_env = args.api_key_env;
    cfg.max_trace_bytes = args.max_trace_mib.max(1) << 20;
    cfg.max_jobs = args.max_jobs;
    cfg.resume = !args.no_resume;
    let auth = cfg.token.is_some();
    let mut interrupts = crate::progress::Interrupts::listen().context("listening for Ctrl-C")?;
    let server = Server::start(store, cfg)
        .await
        .context("starting the web service")?;
    // The first line on stdout is the address, so that a script that asked for port 0 can read it.
    println!("http://{}", server.local_addr());
    eprintln!(
        "tooltune serve: listening on http://{} ({}); Ctrl-C stops",
        server.local_addr(),
        if auth {
            "writes need the bearer token"
        } else {
            "loopback only, no token"
        }
    );
    interrupts.next().await;
    eprintln!("tooltune serve: stopping; unfinished runs resume at the next start");
    server.shutdown().await?;
    Ok(ExitCode::SUCCESS)
}

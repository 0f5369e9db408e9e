//! The `tooltune` command line: thin glue over the library crates, parsing arguments and printing results.

mod demo_cmd;
mod doctor_cmd;
mod eval_cmd;
mod ingest_cmd;
mod label_cmd;
mod llm_config;
mod model_cmd;
mod optimize_cmd;
mod paths;
mod progress;
mod proxy_cmd;
mod report_cmd;
mod rewrite_cmd;
mod search_args;
mod serve_cmd;
mod stats_cmd;
mod suite_cmd;
mod worker_cmd;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::process::ExitCode;

// Ingest parses millions of small JSON values; glibc's malloc took almost half of its CPU time (perf), mimalloc's
// per-thread free lists do not. llama.cpp allocates through C and is unaffected.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Improve MCP tool descriptions from evidence: logged agent runs, re-runs against real servers, and reflection.
#[derive(Debug, Parser)]
#[command(name = "tooltune", version, about, long_about = None)]
struct Cli {
    /// The trace store: a SQLite file path, sqlite://PATH or postgres://... [default: a SQLite file in the data dir]
    #[arg(
        long,
        global = true,
        env = "TOOLTUNE_DATABASE_URL",
        hide_env_values = true
    )]
    database_url: Option<String>,

    /// A config file whose `[llm]` table names the agent's and the reflector's models [default: config.toml in the
    /// data dir, when it exists]
    #[arg(long, global = true, env = "TOOLTUNE_CONFIG")]
    config: Option<std::path::PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Store trajectories from trace files (tooltune JSONL, OpenAI chat, Langfuse, OpenTelemetry GenAI).
    Ingest(ingest_cmd::IngestArgs),
    /// Look at the stored trajectories.
    Traces {
        #[command(subcommand)]
        command: TracesCommand,
    },
    /// Check this machine and build: CPU features, the llama.cpp kernels compiled in, the models' hashes, and a
    /// self-test of the engine. The first thing to run when something looks wrong.
    Doctor(doctor_cmd::DoctorArgs),
    /// Fetch or serve the embedded local model.
    Model(model_cmd::ModelArgs),
    /// Run an MCP server (stdio) behind tooltune: hosts see chosen descriptions, or A/B variants, and each
    /// session's tool calls are recorded (`tooltune traces stats --by variant`).
    Proxy(proxy_cmd::ProxyArgs),
    /// Run a suite against its real MCP server with candidate descriptions; per-task outcomes and aggregates.
    Eval(eval_cmd::EvalArgs),
    /// Optimise a tool's description on a suite (GEPA) for task success or selection rate.
    Optimize(optimize_cmd::OptimizeArgs),
    /// The overconfident contractor: optimise one description for task success and for selection rate, side by
    /// side, and write a report comparing them. With the defaults 11 to 13 minutes on two cores (measured on an AMD
    /// EPYC virtual machine, 1.5B agent and reflector: 10 min 58 s with the AVX-512 build, 12 min 45 s AVX2-only,
    /// peak RSS 2.2 GB).
    Demo(demo_cmd::DemoArgs),
    /// The baseline a search must beat: each tool's description rewritten once by the reflector from a good prompt,
    /// without evidence (`--best-of K`: K rewrites, the best on the training split's exact routing kept).
    Rewrite(rewrite_cmd::RewriteArgs),
    /// Write an HTML report (and its figures as JSON) of one or several optimisation runs, side by side.
    Report(report_cmd::ReportArgs),
    /// Serve the JSON API and the dashboard (tools, runs with live progress, trajectories) over the store.
    Serve(serve_cmd::ServeArgs),
    /// Take rollout jobs of runs started with --workers from the PostgreSQL store and play them on this machine.
    Worker(worker_cmd::WorkerArgs),
    /// Draft a task suite for a server nobody wrote tasks for, make one from logged runs, or check that a suite's
    /// tasks are still solvable.
    Suite {
        #[command(subcommand)]
        command: suite_cmd::SuiteCommand,
    },
}

#[derive(Debug, Subcommand)]
enum TracesCommand {
    /// Per tool and description version: times shown, times chosen, selection share, success when chosen.
    Stats(stats_cmd::StatsArgs),
    /// Label the trajectories whose producer wrote no outcome: heuristics over the log, and a judge model with
    /// --judge. Labels are stored apart from the producers' outcomes.
    Label(label_cmd::LabelArgs),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TOOLTUNE_LOG")
                // llama.cpp warns about the GGUF's tokenizer on every load; it is harmless and known
                // (see llm/README.md), so it is not shown unless asked for.
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,llama-cpp-2=error")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode> {
    let db = paths::database_url(cli.database_url.as_deref())?;
    if matches!(
        cli.command,
        Command::Ingest(_)
            | Command::Traces {
                command: TracesCommand::Stats(_)
            }
            | Command::Report(_)
    ) {
        stop_quietly_when_stdout_closes();
    }
    match cli.command {
        Command::Ingest(args) => ingest_cmd::run(&db, args).await,
        Command::Traces {
            command: TracesCommand::Stats(args),
        } => stats_cmd::run(&db, args).await,
        Command::Traces {
            command: TracesCommand::Label(args),
        } => label_cmd::run(&db, cli.config.as_deref(), args).await,
        Command::Doctor(args) => doctor_cmd::run(args).await,
        Command::Model(args) => model_cmd::run(args).await,
        Command::Proxy(args) => proxy_cmd::run(&db, args).await,
        Command::Eval(args) => eval_cmd::run(&db, cli.config.as_deref(), args).await,
        Command::Optimize(args) => optimize_cmd::run(&db, cli.config.as_deref(), args).await,
        Command::Demo(args) => demo_cmd::run(&db, cli.config.as_deref(), args).await,
        Command::Report(args) => report_cmd::run(&db, args).await,
        Command::Rewrite(args) => rewrite_cmd::run(cli.config.as_deref(), args).await,
        Command::Serve(args) => serve_cmd::run(&db, args).await,
        Command::Worker(args) => worker_cmd::run(&db, cli.config.as_deref(), args).await,
        Command::Suite { command } => suite_cmd::run(&db, cli.config.as_deref(), command).await,
    }
}

/// Lets the commands that only read files and the store and print (`ingest`, `traces stats`, `report`; not
/// `traces label`, whose judge may be a model server) end quietly
/// when their reader goes away (`tooltune traces stats | head`), as Unix tools do, instead of panicking in
/// `println!` on a broken pipe. Rust ignores SIGPIPE so that writing to a closed pipe or socket is an error to
/// handle; the commands that talk to MCP servers over pipes, to model servers or to browsers keep it that way.
#[cfg(unix)]
#[allow(unsafe_code)] // The workspace denies unsafe code; std has no safe way to set a signal's disposition.
fn stop_quietly_when_stdout_closes() {
    // SAFETY: sets one signal back to its default action; no handler of ours is involved.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(not(unix))]
fn stop_quietly_when_stdout_closes() {}

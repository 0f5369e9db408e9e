//! `tooltune worker`: take rollout jobs from the PostgreSQL store's queues and play them on this machine, for runs
//! started with `--workers` (on this machine or another). Runs until Ctrl-C (finishing its current batch) or,
//! with `--idle-exit`, until it has had nothing to do for that long.

use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tooltune_store::Store;
use tooltune_worker::{Queue, WorkerEvent, WorkerOptions};

/// Arguments of `tooltune worker`.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// The agent's model: local (Qwen2.5-Coder-1.5B), local:fast (0.5B), or openai:MODEL@BASE_URL [default: the
    /// config file's, else local]. Only jobs sent for this same model (and, for an embedded model, this build's
    /// SIMD path) are taken.
    #[arg(long, env = "TOOLTUNE_AGENT")]
    model: Option<String>,
    /// Environment variable holding the API key of an OpenAI-compatible endpoint.
    #[arg(long)]
    api_key_env: Option<String>,
    /// CPU threads of the embedded model (default 2). Several workers on one machine should share its cores
    /// (llama.cpp threads that outnumber the cores wait on each other), but the count changes greedy output, so
    /// such a worker serves only runs whose agent model has the same count.
    #[arg(long)]
    threads: Option<i32>,
    /// Jobs taken at once, played as one batch of the model when they share a candidate.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Seconds a taken job stays hidden from other workers without this worker's heartbeat: a killed worker's
    /// jobs go to another after this long.
    #[arg(long, default_value_t = 60)]
    visibility_timeout: u64,
    /// Seconds one call to the store or the queue may take before the worker counts the store as lost and tries
    /// again later. It is what notices a network that drops packets without resetting connections (a broken
    /// route between machines), where no socket error ever comes.
    #[arg(long, default_value_t = 20.0)]
    store_timeout: f64,
    /// A folder holding suite files and what they reference (`${SUITE_DIR}/...`); repeat for several [default:
    /// datasets/suites, when it exists here]
    #[arg(long = "suite-dir")]
    suite_dirs: Vec<PathBuf>,
    /// Stop after this many seconds with nothing to do (default: run until Ctrl-C).
    #[arg(long)]
    idle_exit: Option<f64>,
    /// Print one JSON object per event (started, cannot serve, batch) and the totals at the end.
    #[arg(long)]
    json: bool,
}

pub async fn run(db: &str, config: Option<&std::path::Path>, args: WorkerArgs) -> Result<ExitCode> {
    let store = Store::open(db).await?;
    let queue = Queue::connect(db).await?;
    let (agent, _) = crate::llm_config::resolve(config, args.model.as_deref(), None)?;
    let mut spec = crate::llm_config::spec(&agent, args.api_key_env.as_deref())
        .with_context(|| format!("--model {agent}"))?;
    if let Some(t) = args.threads {
        match &mut spec {
            tooltune_llm::BackendSpec::Local { threads, .. } => *threads = Some(t.max(1)),
            _ => {
                anyhow::bail!("--threads is for the embedded model; --model {agent} is an endpoint")
            }
        }
    }
    let model = tooltune_llm::build(&spec).await?;
    let mut suite_dirs = args.suite_dirs.clone();
    if suite_dirs.is_empty() && std::path::Path::new("datasets/suites").is_dir() {
        suite_dirs.push(PathBuf::from("datasets/suites"));
    }
    let opts = WorkerOptions {
        concurrency: args.concurrency.max(1),
        visibility: Duration::from_secs(args.visibility_timeout.max(3)),
        suite_dirs,
        idle_exit: args.idle_exit.map(Duration::from_secs_f64),
        store_timeout: Duration::from_secs_f64(args.store_timeout.max(0.5)),
        ..WorkerOptions::default()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = Arc::clone(&stop);
    let json = args.json;
    let mut interrupts = crate::progress::Interrupts::listen().context("listening for Ctrl-C")?;
    tokio::spawn(async move {
        if interrupts.next().await {
            if !json {
                eprintln!("stopping after the current batch (its jobs are finished, not lost)");
            }
            stop2.store(true, Ordering::Relaxed);
        }
    });
    let started = Instant::now();
    let totals = std::sync::Mutex::new((0usize, 0usize));
    let on_event = |e: &WorkerEvent| {
        let elapsed = started.elapsed().as_secs_f64();
        match e {
            WorkerEvent::Started { id, model } => {
                if json {
                    println!(
                        "{}",
                        serde_json::json!({"event": "started", "worker": id, "model": model})
                    );
                } else {
                    eprintln!("worker {id} serving {model}; waiting for jobs (Ctrl-C stops)");
                }
            }
            WorkerEvent::CannotServe { reason } => {
                if json {
                    println!(
                        "{}",
                        serde_json::json!({"event": "cannot_serve", "reason": reason})
                    );
                } else {
                    eprintln!("{reason}; its jobs are left to other workers");
                }
            }
            WorkerEvent::Taken { suite, jobs } => {
                if json {
                    println!(
                        "{}",
                        serde_json::json!({"event": "taken", "suite": suite, "jobs": jobs, "elapsed_s": elapsed})
                    );
                }
            }
            WorkerEvent::StoreLost { error, retry_in_s } => {
                if json {
                    println!(
                        "{}",
                        serde_json::json!({"event": "store_lost", "error": error, "retry_in_s": retry_in_s,
                            "elapsed_s": elapsed})
                    );
                } else {
                    eprintln!(
                        "[{elapsed:>4.0} s] the store cannot be reached ({error}); trying again in \
                         {retry_in_s:.0} s (jobs held now go back to the queue after their visibility timeout)"
                    );
                }
            }
            WorkerEvent::StoreBack { seconds } => {
                if json {
                    println!(
                        "{}",
                        serde_json::json!({"event": "store_back", "after_s": seconds, "elapsed_s": elapsed})
                    );
                } else {
                    eprintln!("[{elapsed:>4.0} s] the store answers again after {seconds:.0} s");
                }
            }
            WorkerEvent::Batch {
                suite,
                jobs,
                written,
                retried,
                given_up,
                seconds,
            } => {
                let mut t = totals
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                t.0 += written;
                t.1 += retried + given_up;
                if json {
                    println!(
                        "{}",
                        serde_json::json!({"event": "batch", "suite": suite, "jobs": jobs, "written": written,
                            "retried": retried, "given_up": given_up, "seconds": seconds, "elapsed_s": elapsed})
                    );
                } else {
                    eprintln!(
                        "[{:>4.0} s] {suite}: {jobs} jobs in {seconds:.1} s ({written} written, {retried} left \
                         for another attempt, {given_up} given up); {} done so far",
                        elapsed, t.0
                    );
                }
            }
        }
    };
    let totals = tooltune_worker::work(&store, &queue, model, &opts, stop, &on_event).await?;
    if json {
        println!(
            "{}",
            serde_json::json!({"event": "stopped", "jobs_done": totals.jobs_done, "failures": totals.failures})
        );
    } else {
        eprintln!(
            "worker stopped: {} jobs done, {} not finished",
            totals.jobs_done, totals.failures
        );
    }
    Ok(ExitCode::SUCCESS)
}

//! Workers benchmark (issue 30): one candidate (the server's own descriptions) on the first 40 contractor tasks
//! with the 0.5B model, played in this process by the evaluator, then as jobs by 1, 2 and 4 `tooltune worker`
//! processes on this machine, each on a fresh PostgreSQL database. Prints wall time, the workers' model time, and
//! the queue's overhead per job, side by side.
//!
//! `cargo bench --workspace --bench workers` (PostgreSQL from `TOOLTUNE_TEST_POSTGRES_URL`, e.g.
//! `export TOOLTUNE_TEST_POSTGRES_URL="$(.ci/start-postgres)"`). `TOOLTUNE_BENCH_TASKS` (40),
//! `TOOLTUNE_BENCH_WORKERS` (1,2,4), `TOOLTUNE_BENCH_CONCURRENCY` (8, jobs a worker takes at once).
//!
//! Workers on this machine share its cores (`--threads` = cores / workers), so more workers here only show the
//! queue's cost and the smaller batches; across machines each brings its own cores.
//!
//! Overhead per job is measured on the critical path: the wall time less the busiest worker's evaluation time
//! (its batches' `evaluate` calls, which include the MCP calls and checks, as the in-process figure does),
//! divided by that worker's jobs. It holds sending, reading, result writes, archiving, the driver's polling and
//! any time that worker waited for jobs.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tooltune_evaluator::Suite;
use tooltune_evaluator::evaluate::{Candidate, EvalOptions, Mode, evaluate};
use tooltune_evaluator::host::HostConfig;
use tooltune_store::{JobSuite, Store};
use tooltune_worker::{Dispatcher, Job, WorkerPolicy};

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .to_path_buf()
}

async fn fresh_db(admin: &str, tag: &str) -> (String, String) {
    use sqlx::Connection;
    let name = format!("tooltune_bench_workers_{tag}_{}", std::process::id());
    let mut c = sqlx::PgConnection::connect(admin).await.expect("connect");
    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&mut c)
        .await;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut c)
        .await
        .expect("create database");
    let (base, _) = admin.rsplit_once('/').expect("URL with a database");
    (format!("{base}/{name}"), name)
}

async fn drop_db(admin: &str, name: &str) {
    use sqlx::Connection;
    if let Ok(mut c) = sqlx::PgConnection::connect(admin).await {
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .execute(&mut c)
            .await;
    }
}

fn start_worker(
    db: &str,
    concurrency: usize,
    threads: usize,
) -> (Child, std::sync::mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tooltune"))
        .arg("--database-url")
        .arg(db)
        .args(["worker", "--model", "local:fast", "--json", "--concurrency"])
        .arg(concurrency.to_string())
        .arg("--threads")
        .arg(threads.to_string())
        .arg("--suite-dir")
        .arg(workspace().join("datasets/suites"))
        .env_remove("TOOLTUNE_DATABASE_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start a worker");
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (child, rx)
}

/// Threads of each of `n` workers on this machine: its cores shared out (at least one each), so that llama.cpp
/// threads never outnumber the cores; the in-process run has them all.
fn threads(n: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |c| c.get());
    (cores / n.max(1)).max(1)
}

fn main() {
    let Ok(admin) = std::env::var("TOOLTUNE_TEST_POSTGRES_URL") else {
        eprintln!(
            "workers bench: set TOOLTUNE_TEST_POSTGRES_URL (export TOOLTUNE_TEST_POSTGRES_URL=\"$(.ci/start-postgres)\")"
        );
        std::process::exit(2);
    };
    let n_tasks: usize = env("TOOLTUNE_BENCH_TASKS", 40);
    let concurrency: usize = env("TOOLTUNE_BENCH_CONCURRENCY", 8);
    let counts: Vec<usize> = std::env::var("TOOLTUNE_BENCH_WORKERS")
        .unwrap_or_else(|_| "1,2,4".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let status = Command::new(env!("CARGO"))
        .current_dir(workspace())
        .args(["build", "-q", "--release", "-p", "contractor"])
        .status()
        .expect("cargo");
    assert!(status.success(), "building the contractor server");
    let suite_path = workspace().join("datasets/suites/contractor.toml");
    let suite = Suite::load(&suite_path).expect("suite");
    let tasks: Vec<String> = suite
        .tasks
        .iter()
        .take(n_tasks)
        .map(|t| t.id.clone())
        .collect();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "workers bench: {} contractor tasks, one candidate (the server's descriptions), 0.5B model (local:fast), \
         {} on {cores} cores, SIMD path {}",
        tasks.len(),
        cpu,
        tooltune_evaluator::host::simd_path()
    );
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let mut spec = tooltune_llm::BackendSpec::parse("local:fast", None).expect("spec");
        if let tooltune_llm::BackendSpec::Local { threads: t, .. } = &mut spec {
            *t = Some(threads(1) as i32);
        }
        // In this process: the evaluator over the same tasks, batches of `concurrency`.
        let model_id = {
            let model = tooltune_llm::build(&spec).await.expect("model");
            let server = suite.connect().await.expect("server");
            let opts = EvalOptions {
                task_ids: tasks.clone(),
                mode: Mode::Full,
                batch: concurrency,
                host: HostConfig {
                    seed: Some(0),
                    ..HostConfig::default()
                },
                ..EvalOptions::default()
            };
            let t0 = Instant::now();
            let r = evaluate(
                &suite,
                &server,
                model.as_ref(),
                None,
                &Candidate::default(),
                &opts,
                |_, _| {},
            )
            .await
            .expect("evaluate");
            let wall = t0.elapsed().as_secs_f64();
            server.shutdown().await;
            println!(
                "{:<32} wall {:>6.1} s  ({:.2} s a task; success {}/{})",
                format!("in process, {} thread(s)", threads(1)),
                wall,
                wall / tasks.len() as f64,
                r.tasks.iter().filter(|t| t.success).count(),
                r.tasks.len()
            );
            model.id()
        };
        let suite_text = std::fs::read_to_string(&suite_path).expect("suite text");
        let digest = {
            use sha2::Digest;
            hex::encode(sha2::Sha256::digest(suite_text.as_bytes()))
        };
        for &n in &counts {
            let (db, name) = fresh_db(&admin, &n.to_string()).await;
            let store = Store::open(&db).await.expect("store");
            // The workers' thread count is part of the identity their jobs are sent for.
            let dispatcher = Dispatcher::open(
                &store,
                &model_id,
                &tooltune_llm::local::numerics_for_threads(threads(n) as i32),
                &JobSuite {
                    digest: digest.clone(),
                    name: suite.name.clone(),
                    text: suite_text.clone(),
                    origin: suite_path.display().to_string(),
                    fixture_digest: String::new(),
                },
                WorkerPolicy::default(),
            )
            .await
            .expect("dispatcher");
            let mut workers: Vec<(Child, std::sync::mpsc::Receiver<String>)> =
                (0..n).map(|_| start_worker(&db, concurrency, threads(n))).collect();
            // The clock starts once every worker has its model loaded and is waiting.
            for (_, rx) in &workers {
                loop {
                    let line = rx
                        .recv_timeout(Duration::from_secs(300))
                        .expect("a worker started");
                    if line.contains("\"started\"") {
                        break;
                    }
                }
            }
            let jobs: Vec<Job> = tasks
                .iter()
                .map(|t| Job {
                    key: format!("bench-{n}-{t}"),
                    suite: digest.clone(),
                    model: dispatcher.model().to_string(),
                    task_id: t.clone(),
                    mode: Mode::Full,
                    descriptions: Default::default(),
                    target: "search_docs".into(),
                    rollout: 0,
                    seed: Some(0),
                    run_id: None,
                    candidate_id: Some("bench".into()),
                    max_attempts: 3,
                    call_timeout_ms: 30_000,
                })
                .collect();
            let t0 = Instant::now();
            let results = dispatcher.run(&jobs, &|| false).await.expect("jobs");
            let wall = t0.elapsed().as_secs_f64();
            for (c, _) in &mut workers {
                let _ = c.kill();
                let _ = c.wait();
            }
            let mut busy: HashMap<String, (f64, usize)> = HashMap::new();
            for r in &results {
                let e = busy.entry(r.worker.clone()).or_default();
                e.0 += r.model_ms / 1000.0;
                e.1 += 1;
            }
            let (busiest_s, busiest_jobs) = busy
                .values()
                .copied()
                .fold((0.0, 0), |a, b| if b.0 > a.0 { b } else { a });
            let model_s: f64 = busy.values().map(|b| b.0).sum();
            let worker_queue_ms =
                results.iter().map(|r| r.queue_ms).sum::<f64>() / results.len().max(1) as f64;
            let success = results
                .iter()
                .filter(|r| {
                    serde_json::from_str::<tooltune_evaluator::evaluate::TaskResult>(&r.result)
                        .expect("a job result is a task result")
                        .success
                })
                .count();
            println!(
                "{:<32} wall {:>6.1} s  ({:.2} s a task; success {success}/{}); workers' evaluation {:.1} s in all, \
                 busiest {:.1} s over {} jobs; queue overhead {:.1} ms a job on the critical path, the workers' \
                 own queue reads {:.1} ms a job; jobs per worker {:?}",
                format!("{n} worker(s), {} thread(s) each", threads(n)),
                wall,
                wall / tasks.len() as f64,
                results.len(),
                model_s,
                busiest_s,
                busiest_jobs,
                (wall - busiest_s) * 1000.0 / busiest_jobs.max(1) as f64,
                worker_queue_ms,
                {
                    let mut v: Vec<usize> = busy.values().map(|b| b.1).collect();
                    v.sort_unstable();
                    v
                }
            );
            store.close().await;
            drop(dispatcher);
            drop_db(&admin, &name).await;
        }
    });
}

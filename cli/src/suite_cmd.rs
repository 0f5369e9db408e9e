//! `tooltune suite draft`, `tooltune suite from-traces` and `tooltune suite check`: argument parsing, the drafting
//! model, reading the logged runs from the store, progress on stderr and the summary on stdout, over the draft
//! crate.

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tooltune_draft::{Counts, DraftConfig, DraftOutcome, FromTracesConfig, LoggedRun};
use tooltune_evaluator::{ProtocolPref, ServerSpec};
use tooltune_store::{LabelUse, LoggedFilter, Store};

/// Write or check task suites.
#[derive(Debug, clap::Subcommand)]
pub enum SuiteCommand {
    /// Write a suite for a server nobody wrote tasks for: explore its read-only tools, draft requests with a model,
    /// verify each on the server with a reference call, and write the suite and a review page (.review.md and
    /// .review.html beside it). Ctrl-C keeps what was verified so far.
    Draft(Box<DraftArgs>),
    /// Make a suite from the stored logged runs (`tooltune ingest`, labelled by `tooltune traces label` where the
    /// producer wrote no outcome): each request once, owned by the tool its successful runs called first, with an
    /// answer check where their answers share a number, name or date. With a server (`-- COMMAND` or --url) the
    /// logged calls (the owner's first) are run there and the task kept only if the owner's call succeeds; without
    /// one the tasks are written unverified.
    FromTraces(Box<FromTracesArgs>),
    /// Run every task's reference calls and report the tasks that are no longer solvable, with file and line.
    Check(CheckArgs),
}

/// `suite draft`.
#[derive(Debug, clap::Args)]
pub struct DraftArgs {
    /// The suite file to write (replaced atomically; with --more, added to).
    #[arg(long, default_value = "drafted.toml")]
    out: PathBuf,
    /// Requests drafted per tool (before verification drops some).
    #[arg(long, default_value_t = 4)]
    per_tool: usize,
    /// Requests that no tool serves [default: half of --per-tool, at least 2].
    #[arg(long)]
    no_tool: Option<usize>,
    /// Pairs of confusable tools to draft requests between.
    #[arg(long, default_value_t = 2)]
    pairs: usize,
    /// Seeds the drafting model's sampling and the splits.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// A folder or file copied for every call of a tool that may write (and for exploration); name the copy in
    /// the command as '${FIXTURE_DIR}' (quoted, so the shell leaves it).
    #[arg(long)]
    fixture: Option<PathBuf>,
    /// A Streamable HTTP server instead of a command.
    #[arg(long, conflicts_with = "command")]
    url: Option<String>,
    /// The drafting model: local (Qwen2.5-Coder-1.5B), local:fast (0.5B), or openai:MODEL@BASE_URL [default: the
    /// config file's reflector, else local]
    #[arg(long, env = "TOOLTUNE_REFLECTOR")]
    reflector: Option<String>,
    /// Environment variable holding the API key of an OpenAI-compatible endpoint.
    #[arg(long)]
    api_key_env: Option<String>,
    /// Add N requests per tool to the suite at --out (which must exist), repeating none already there.
    #[arg(long, value_name = "N")]
    more: Option<usize>,
    /// The suite's name [default: the file name].
    #[arg(long)]
    name: Option<String>,
    /// Seconds one reference or exploration call may take.
    #[arg(long, default_value_t = 30.0)]
    call_timeout: f64,
    /// The protocol revision: auto, or one such as 2025-11-25.
    #[arg(long, default_value = "auto")]
    protocol: String,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// The server's command and arguments, after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// `suite from-traces`.
#[derive(Debug, clap::Args)]
pub struct FromTracesArgs {
    /// The suite file to write (replaced atomically; refused when it exists).
    #[arg(long, default_value = "from-traces.toml")]
    out: PathBuf,
    /// Only requests owned by this tool (repeat for several).
    #[arg(long)]
    tool: Vec<String>,
    /// Only runs that started on or after this date (YYYY-MM-DD) or RFC 3339 time; runs without a logged start time
    /// count from when they were ingested.
    #[arg(long)]
    since: Option<String>,
    /// Only runs that started on or before this date (the whole day) or time.
    #[arg(long)]
    until: Option<String>,
    /// Only runs whose verdict came from these sources: producer (the log's own outcome), judge, heuristic
    /// (`traces label`); comma-separated or repeated [default: any verdict, unjudged runs read too].
    #[arg(long, value_delimiter = ',')]
    label_source: Vec<String>,
    /// Whether tooltune's labels count where the producer wrote no outcome: use or ignore.
    #[arg(long, default_value = "use")]
    labels: String,
    /// Read at most this many runs (the earliest logged first).
    #[arg(long, default_value_t = 100_000)]
    limit: u64,
    /// Seeds the splits.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// A folder or file copied for every call of a tool that may write; name the copy in the command as
    /// '${FIXTURE_DIR}'.
    #[arg(long)]
    fixture: Option<PathBuf>,
    /// A Streamable HTTP server instead of a command.
    #[arg(long, conflicts_with = "command")]
    url: Option<String>,
    /// The suite's name [default: the file name].
    #[arg(long)]
    name: Option<String>,
    /// Seconds one reference call may take.
    #[arg(long, default_value_t = 30.0)]
    call_timeout: f64,
    /// The protocol revision: auto, or one such as 2025-11-25.
    #[arg(long, default_value = "auto")]
    protocol: String,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// The server's command and arguments, after `--` (optional: without a server the tasks are not verified).
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// `suite check`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// The suite file.
    file: PathBuf,
    /// Seconds one reference call may take.
    #[arg(long, default_value_t = 30.0)]
    call_timeout: f64,
    /// Print the findings as JSON on stdout.
    #[arg(long)]
    json: bool,
}

pub async fn run(
    db: &str,
    config: Option<&std::path::Path>,
    command: SuiteCommand,
) -> Result<ExitCode> {
    match command {
        SuiteCommand::Draft(args) => draft(config, *args).await,
        SuiteCommand::FromTraces(args) => from_traces(db, *args).await,
        SuiteCommand::Check(args) => check(args).await,
    }
}

fn timeout(secs: f64, flag: &str) -> Result<Duration> {
    if !(secs.is_finite() && secs > 0.0) {
        bail!("{flag} {secs}: give a positive number of seconds");
    }
    Ok(Duration::from_secs_f64(secs))
}

fn bar(unit: &str) -> ProgressBar {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "{{spinner}} {{msg}} [{{bar:30}}] {{pos}}/{{len}} {unit} ({{elapsed}}, about {{eta}} left)"
        ))
        .unwrap_or(ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar
}

/// The server given as `--url` or after `--`, if any.
fn server_spec(
    url: Option<&str>,
    command: &[String],
    protocol: &str,
) -> Result<Option<ServerSpec>> {
    let protocol = ProtocolPref::parse(protocol).map_err(|m| anyhow::anyhow!("--protocol: {m}"))?;
    Ok(match (url, command.split_first()) {
        (Some(url), _) => Some(ServerSpec::http(url, url)),
        (None, Some((cmd, rest))) => {
            let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
            Some(ServerSpec::stdio(cmd.clone(), cmd.clone(), &rest))
        }
        (None, None) => None,
    }
    .map(|s| s.with_protocol(protocol)))
}

async fn draft(config: Option<&std::path::Path>, args: DraftArgs) -> Result<ExitCode> {
    let Some(server) = server_spec(args.url.as_deref(), &args.command, &args.protocol)? else {
        bail!(
            "give the server: `tooltune suite draft -- COMMAND [ARGS...]` (or --url URL for Streamable HTTP)"
        );
    };
    if args.more.is_some() && !args.out.exists() {
        bail!(
            "--more adds to an existing suite, but {} does not exist; draft it first without --more",
            args.out.display()
        );
    }
    if args.more.is_none() && args.out.exists() {
        bail!(
            "{} exists; pass --more N to add tasks to it, or another --out",
            args.out.display()
        );
    }
    let per_tool = args.more.unwrap_or(args.per_tool);
    let mut counts = Counts::for_per_tool(per_tool);
    counts.pairs = args.pairs;
    if let Some(n) = args.no_tool {
        counts.no_tool = n;
    }
    let cfg = DraftConfig {
        server,
        fixture: args.fixture.clone(),
        out: args.out.clone(),
        name: args.name.clone(),
        counts,
        seed: args.seed,
        call_timeout: timeout(args.call_timeout, "--call-timeout")?,
        more: args.more.is_some(),
    };

    // The drafting model is the reflector: --reflector, else the config file's, else the embedded 1.5B.
    let (_, reflector) = crate::llm_config::resolve(config, None, args.reflector.as_deref())?;
    let spec = crate::llm_config::spec(&reflector, args.api_key_env.as_deref())
        .with_context(|| format!("--reflector {reflector}"))?;
    let model = tooltune_llm::build(&spec).await?;

    let stop = Arc::new(AtomicBool::new(false));
    let mut interrupts = crate::progress::Interrupts::listen().context("listening for Ctrl-C")?;
    let stop2 = Arc::clone(&stop);
    tokio::spawn(async move {
        if interrupts.next().await {
            stop2.store(true, Ordering::SeqCst);
            eprintln!(
                "stopping after the current batch: what was verified is written (Ctrl-C again to quit now)"
            );
            if interrupts.next().await {
                std::process::exit(130);
            }
        }
    });

    let bar = bar("steps");
    bar.set_message(format!("drafting with {}", model.id()));
    let b2 = bar.clone();
    let mut on_progress = move |p: &tooltune_draft::Progress| {
        b2.set_message(p.stage);
        b2.set_length(p.total as u64);
        b2.set_position(p.done as u64);
    };
    let result = tooltune_draft::draft(&cfg, model.as_ref(), &stop, &mut on_progress).await;
    bar.finish_and_clear();
    let outcome = result?;

    print_outcome(&outcome, args.json)?;
    Ok(ExitCode::SUCCESS)
}

/// The one-line summary and the review pages' paths, or the JSON summary.
fn print_outcome(outcome: &DraftOutcome, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&outcome.summary())?);
    } else {
        let s = outcome.summary();
        println!(
            "{}: {} tasks kept of {} {} ({} with an answer check, {} routing only), {} dropped{} in {:.0} s",
            outcome
                .suite
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            outcome.kept.len(),
            outcome.drafted(),
            if outcome.traces.is_some() {
                "logged requests"
            } else {
                "drafted"
            },
            s["answer_checked"],
            s["routing_only"],
            outcome.dropped.len(),
            {
                let r = outcome.dropped_by_reason();
                if r.is_empty() {
                    String::new()
                } else {
                    format!(
                        " ({})",
                        r.iter()
                            .map(|(k, n)| format!("{n} {k}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                }
            },
            outcome.seconds
        );
        println!(
            "review: {} (and {})",
            outcome.review_md.display(),
            outcome.review_html.display()
        );
    }
    Ok(())
}

/// A `--since`/`--until` value: a date `YYYY-MM-DD`, or a time that begins with one (`2025-06-02T09:00:00Z`).
/// Compared as text with the stored times, so only the shape is checked here.
fn date_arg(flag: &str, v: &str) -> Result<String> {
    let b = v.as_bytes();
    let num = |r: std::ops::Range<usize>| {
        b.get(r.clone())
            .filter(|d| d.iter().all(u8::is_ascii_digit))
            .and_then(|_| v[r].parse::<u32>().ok())
    };
    let ok = b.len() >= 10
        && b[4] == b'-'
        && b[7] == b'-'
        && num(0..4).is_some()
        && num(5..7).is_some_and(|m| (1..=12).contains(&m))
        && num(8..10).is_some_and(|d| (1..=31).contains(&d))
        && (b.len() == 10 || (b[10] == b'T' && b.len() > 11));
    if !ok {
        bail!(
            "{flag} {v:?}: give a date YYYY-MM-DD or an RFC 3339 time such as 2025-06-02T09:00:00Z"
        );
    }
    Ok(v.to_string())
}

async fn from_traces(db: &str, args: FromTracesArgs) -> Result<ExitCode> {
    let server = server_spec(args.url.as_deref(), &args.command, &args.protocol)?;
    if args.fixture.is_some() && server.is_none() {
        bail!("--fixture needs a server to run on: give it after `--` (or --url)");
    }
    if args.out.exists() {
        bail!(
            "{} exists; pass another --out (or remove it first)",
            args.out.display()
        );
    }
    for s in &args.label_source {
        if !["producer", "judge", "heuristic"].contains(&s.as_str()) {
            bail!("--label-source {s:?}: expected producer, judge or heuristic");
        }
    }
    let labels: LabelUse = args
        .labels
        .parse()
        .map_err(|m| anyhow::anyhow!("--labels {m}"))?;
    let filter = LoggedFilter {
        tools: args.tool.clone(),
        since: args
            .since
            .as_deref()
            .map(|v| date_arg("--since", v))
            .transpose()?,
        until: args
            .until
            .as_deref()
            .map(|v| date_arg("--until", v))
            .transpose()?,
        verdict_sources: args.label_source.clone(),
        labels,
        limit: args.limit,
    };
    let mut words: Vec<String> = Vec::new();
    if !args.tool.is_empty() {
        words.push(format!("--tool {}", args.tool.join(", ")));
    }
    if let Some(s) = &filter.since {
        words.push(format!("--since {s}"));
    }
    if let Some(u) = &filter.until {
        words.push(format!("--until {u}"));
    }
    if !args.label_source.is_empty() {
        words.push(format!("--label-source {}", args.label_source.join(",")));
    }

    let store = Store::open(db).await?;
    let verdicts = store
        .logged_runs(&filter)
        .await
        .context("reading the logged runs")?;
    let filters = if words.is_empty() {
        format!(
            "the store {} holds no logged run",
            tooltune_store::redact_url(db)
        )
    } else {
        format!("none matches {}", words.join(", "))
    };
    let mut runs = Vec::with_capacity(verdicts.len());
    for v in verdicts {
        let Some(trajectory) = store.trajectory(&v.id).await? else {
            continue;
        };
        runs.push(LoggedRun {
            id: v.id.to_string(),
            trajectory,
            success: v.success,
        });
    }
    store.close().await;
    let cfg = FromTracesConfig {
        server,
        fixture: args.fixture.clone(),
        out: args.out.clone(),
        name: args.name.clone(),
        tools: args.tool.clone(),
        filters,
        seed: args.seed,
        call_timeout: timeout(args.call_timeout, "--call-timeout")?,
    };

    let stop = Arc::new(AtomicBool::new(false));
    let mut interrupts = crate::progress::Interrupts::listen().context("listening for Ctrl-C")?;
    let stop2 = Arc::clone(&stop);
    tokio::spawn(async move {
        if interrupts.next().await {
            stop2.store(true, Ordering::SeqCst);
            eprintln!("stopping: what was verified is written (Ctrl-C again to quit now)");
            if interrupts.next().await {
                std::process::exit(130);
            }
        }
    });
    let bar = bar("requests");
    bar.set_message("from traces");
    let b2 = bar.clone();
    let mut on_progress = move |p: &tooltune_draft::Progress| {
        b2.set_message(p.stage);
        b2.set_length(p.total as u64);
        b2.set_position(p.done as u64);
    };
    let result = tooltune_draft::from_traces(&cfg, runs, &stop, &mut on_progress).await;
    bar.finish_and_clear();
    print_outcome(&result?, args.json)?;
    Ok(ExitCode::SUCCESS)
}

async fn check(args: CheckArgs) -> Result<ExitCode> {
    let bar = bar("tasks");
    bar.set_message(format!("checking {}", args.file.display()));
    let b2 = bar.clone();
    let mut on_progress = move |done: usize, total: usize| {
        b2.set_length(total as u64);
        b2.set_position(done as u64);
    };
    let report = tooltune_draft::check_suite(
        &args.file,
        timeout(args.call_timeout, "--call-timeout")?,
        &mut on_progress,
    )
    .await;
    bar.finish_and_clear();
    let report = report?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for p in &report.problems {
            let tag = match p.finding {
                tooltune_draft::Finding::Unsolvable => "unsolvable",
                tooltune_draft::Finding::Changed => "changed",
                tooltune_draft::Finding::NotChecked => "not checked",
            };
            println!("{tag}: {p}");
        }
        println!(
            "{}: {} tasks, {} checked, {} no longer solvable",
            report.file.display(),
            report.tasks,
            report.checked,
            report.unsolvable()
        );
    }
    Ok(if report.unsolvable() > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

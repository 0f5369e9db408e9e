//! The JSON API: ingest, tool statistics, suites, runs (list, start, detail, stop) and trajectories. The routes
//! and their shapes are documented in `docs/api.md`.

use crate::view::{self, RunBrief};
use crate::{AppState, WebError};
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::io::Cursor;
use std::path::PathBuf;
use tooltune_core::TrajectoryId;
use tooltune_driver::RunConfig;
use tooltune_ingest::{ChunkReader, FormatChoice, ReadOptions};
use tooltune_objectives::Objective;
use tooltune_optimizer::Budget;
use tooltune_store::ImportOptions;

/// `GET /api/health`: the server answers and which database it uses.
pub(crate) async fn health(State(s): State<AppState>) -> Json<Value> {
    let backend = match s.store.backend() {
        tooltune_store::Backend::Sqlite => "sqlite",
        tooltune_store::Backend::Postgres => "postgres",
    };
    Json(json!({ "ok": true, "backend": backend, "auth": s.cfg.token.is_some() }))
}

/// Unknown routes.
pub(crate) async fn not_found() -> WebError {
    WebError::NotFound("no such endpoint".into())
}

/// Query of `POST /api/traces`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TraceQuery {
    /// auto, tooltune, openai, langfuse or otel.
    #[serde(default)]
    format: Option<String>,
    /// Store the valid records and list the invalid ones, instead of refusing the whole request.
    #[serde(default)]
    skip_invalid: bool,
}

/// `POST /api/traces`: stores the JSONL body, all or nothing unless `skip_invalid=true`.
pub(crate) async fn post_traces(
    State(s): State<AppState>,
    query: Result<Query<TraceQuery>, axum::extract::rejection::QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, WebError> {
    let Query(q) = query.map_err(|e| WebError::BadRequest(e.body_text()))?;
    let body = body.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => WebError::TooLarge {
            limit: s.cfg.max_trace_bytes,
        },
        _ => WebError::BadRequest(e.body_text()),
    })?;
    let choice: FormatChoice = q
        .format
        .as_deref()
        .unwrap_or("auto")
        .parse()
        .map_err(|e: tooltune_ingest::IngestError| WebError::BadRequest(e.to_string()))?;
    let opts = ReadOptions {
        max_record_bytes: s.cfg.max_trace_bytes,
        ..ReadOptions::default()
    };
    // The body is in memory already (it is size-limited), so the reader's first-record detection cannot block.
    let reader = ChunkReader::new(Cursor::new(body), "request", choice, opts)
        .map_err(tooltune_store::StoreError::from)?;
    if reader.format().is_none() {
        return Err(WebError::BadRequest(
            "the request body holds no records (send JSON Lines)".into(),
        ));
    }
    let _writer = s
        .ingest_gate
        .acquire()
        .await
        .map_err(|_| WebError::Internal("the server is shutting down".into()))?;
    let report = s
        .store
        .import(
            reader,
            "request",
            ImportOptions {
                skip_invalid: q.skip_invalid,
            },
            |_| {},
        )
        .await?;
    Ok(Json(json!({
        "ok": true,
        "format": report.format,
        "records": report.records,
        "added": report.added,
        "already_present": report.already_present,
        "skipped": report.skipped,
    })))
}

/// Query of `GET /api/tools`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolsQuery {
    #[serde(default)]
    tool: Option<String>,
    /// `use` (default, as `traces stats`): tooltune's labels count where the producer wrote no outcome; `ignore`.
    #[serde(default)]
    labels: Option<String>,
}

/// `GET /api/tools`: what `tooltune traces stats --json` prints.
pub(crate) async fn tools(
    State(s): State<AppState>,
    query: Result<Query<ToolsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, WebError> {
    let Query(q) = query.map_err(|e| WebError::BadRequest(e.body_text()))?;
    let labels: tooltune_store::LabelUse = match q.labels.as_deref() {
        None => tooltune_store::LabelUse::Use,
        Some(l) => l
            .parse()
            .map_err(|e| WebError::BadRequest(format!("labels={e}")))?,
    };
    let stats = s.store.tool_stats_with(q.tool.as_deref(), labels).await?;
    let trajectories = s.store.count_trajectories().await?;
    Ok(Json(
        json!({ "trajectories": trajectories, "labels": labels, "tools": stats }),
    ))
}

/// A suite a run can use.
#[derive(Debug, Serialize)]
pub(crate) struct SuiteInfo {
    /// What `POST /api/runs` takes as `suite`.
    pub name: String,
    pub description: Option<String>,
    pub tools_under_study: Vec<String>,
    pub tasks: usize,
}

/// The suites in the configured folder, by name; files that do not load are skipped with a log line.
pub(crate) fn list_suites(dir: &std::path::Path) -> Vec<SuiteInfo> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<SuiteInfo> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .filter_map(|p| {
            let name = p.file_stem()?.to_string_lossy().into_owned();
            match tooltune_evaluator::Suite::load(&p) {
                Ok(s) => Some(SuiteInfo {
                    name,
                    description: s.description,
                    tools_under_study: s.tools_under_study,
                    tasks: s.tasks.len(),
                }),
                Err(e) => {
                    tracing::warn!("suite {} does not load: {e}", p.display());
                    None
                }
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// `GET /api/suites`: the suites runs can use, and the models they may name.
pub(crate) async fn suites(State(s): State<AppState>) -> Json<Value> {
    let dir = s.cfg.suites_dir.clone();
    let suites = tokio::task::spawn_blocking(move || list_suites(&dir))
        .await
        .unwrap_or_default();
    let models: Vec<String> = s
        .jobs
        .models_allowed()
        .iter()
        .map(|m| crate::jobs::view_spec(m))
        .collect();
    Json(json!({ "suites": suites, "models": models }))
}

/// Query of `GET /api/runs`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunsQuery {
    #[serde(default)]
    limit: Option<i64>,
}

/// `GET /api/runs`: runs, newest first.
pub(crate) async fn runs(
    State(s): State<AppState>,
    query: Result<Query<RunsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, WebError> {
    let Query(q) = query.map_err(|e| WebError::BadRequest(e.body_text()))?;
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let runs: Vec<RunBrief> = s
        .store
        .runs(limit)
        .await?
        .iter()
        .map(|r| view::brief(r, &s.jobs))
        .collect();
    Ok(Json(json!({ "runs": runs })))
}

/// Body of `POST /api/runs`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StartRun {
    /// A suite of the server's suites folder, by file stem (`contractor-small`).
    suite: String,
    /// Tools to optimise; default: the suite's first tool under study. The first is the one whose selection is
    /// measured.
    #[serde(default)]
    tools: Vec<String>,
    /// `success` or `selection`.
    #[serde(default = "default_objective")]
    objective: String,
    /// Budget in rollouts.
    #[serde(default = "default_budget")]
    budget: u64,
    #[serde(default)]
    max_reflection_tokens: Option<u64>,
    #[serde(default)]
    max_minutes: Option<f64>,
    #[serde(default)]
    seed: u64,
    #[serde(default = "default_minibatch")]
    minibatch: usize,
    #[serde(default)]
    patience: Option<u32>,
    #[serde(default)]
    score_threshold: Option<f64>,
    /// The agent's model: one of the server's allowed specs (default: the first).
    #[serde(default)]
    model: Option<String>,
    /// The reflector's model (default: the agent's).
    #[serde(default)]
    reflector: Option<String>,
    /// Descriptions that replace the server's in the seed candidate (tool -> text), as `--override` does.
    #[serde(default)]
    overrides: std::collections::BTreeMap<String, String>,
    /// How proposals are screened; absent: the CLI's default for the objective. `null` is not accepted: use
    /// `"no_screen": true` for GEPA as published.
    #[serde(default)]
    screening: Option<tooltune_optimizer::Screening>,
    /// GEPA as published: no screening.
    #[serde(default)]
    no_screen: bool,
    /// Budget in screened task evaluations.
    #[serde(default = "default_max_screened")]
    max_screened: u64,
    /// Send the run's rollouts and screens to `tooltune worker` processes (PostgreSQL stores only).
    #[serde(default)]
    workers: bool,
    /// With `workers`: how many times a job may be taken before it counts as an infrastructure failure.
    #[serde(default)]
    max_attempts: Option<u32>,
}

fn default_max_screened() -> u64 {
    1500
}

fn default_objective() -> String {
    "success".into()
}
fn default_budget() -> u64 {
    120
}
fn default_minibatch() -> usize {
    3
}

/// The largest budget a request may ask for; a typo of three zeros should not occupy the server for a week.
const MAX_BUDGET: u64 = 100_000;

impl StartRun {
    /// Checks the request and turns it into the driver's configuration.
    fn into_config(self, s: &AppState) -> Result<RunConfig, WebError> {
        let bad = |m: String| WebError::BadRequest(m);
        let valid_name = !self.suite.is_empty()
            && self
                .suite
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && !self.suite.starts_with('.');
        if !valid_name {
            return Err(bad(format!(
                "suite `{}`: name a suite of the server's suites folder (GET /api/suites lists them)",
                self.suite
            )));
        }
        let path: PathBuf = s.cfg.suites_dir.join(format!("{}.toml", self.suite));
        let path = std::fs::canonicalize(&path).map_err(|_| {
            bad(format!(
                "no suite `{}` (GET /api/suites lists them)",
                self.suite
            ))
        })?;
        let suite = tooltune_evaluator::Suite::load(&path)
            .map_err(|e| bad(format!("suite `{}`: {e}", self.suite)))?;
        let tools = if self.tools.is_empty() {
            suite
                .tools_under_study
                .iter()
                .take(1)
                .cloned()
                .collect::<Vec<_>>()
        } else {
            self.tools
        };
        let Some(target) = tools.first().cloned() else {
            return Err(bad(
                "the suite names no tool under study: pass `tools`".into()
            ));
        };
        let objective: Objective = self
            .objective
            .parse()
            .map_err(|e| bad(format!("objective: {e}")))?;
        if self.budget == 0 || self.budget > MAX_BUDGET {
            return Err(bad(format!("budget must be 1..={MAX_BUDGET} rollouts")));
        }
        if self.minibatch == 0 || self.minibatch > 100 {
            return Err(bad("minibatch must be 1..=100".into()));
        }
        if let Some(m) = self.max_minutes
            && !(m > 0.0 && m.is_finite())
        {
            return Err(bad("max_minutes must be a positive number".into()));
        }
        if self.workers && s.store.backend() != tooltune_store::Backend::Postgres {
            return Err(bad(
                "workers need a PostgreSQL store: the job queue lives in the store's database"
                    .into(),
            ));
        }
        let agent = self
            .model
            .unwrap_or_else(|| s.jobs.default_model().to_string());
        let reflector = self.reflector.unwrap_or_else(|| agent.clone());
        for m in [&agent, &reflector] {
            if !s.jobs.model_allowed(m) {
                return Err(bad(format!(
                    "model `{}` is not allowed on this server (allowed: {})",
                    crate::jobs::view_spec(m),
                    s.jobs
                        .models_allowed()
                        .iter()
                        .map(|m| crate::jobs::view_spec(m))
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
        Ok(RunConfig {
            suite: path,
            tools,
            target,
            objective,
            seed: self.seed,
            budget: Budget {
                max_rollouts: Some(self.budget),
                max_reflection_tokens: self.max_reflection_tokens,
                max_wall_ms: self.max_minutes.map(|m| (m * 60_000.0) as u64),
                max_screened: (!self.no_screen).then_some(self.max_screened),
            },
            screening: if self.no_screen {
                None
            } else {
                Some(self.screening.unwrap_or_else(|| {
                    tooltune_optimizer::Screening::for_objective(
                        objective != Objective::TaskSuccess,
                        tooltune_optimizer::Screening::default().proposals,
                    )
                }))
            },
            seed_overrides: self.overrides,
            validation_sample: None,
            test_sample: None,
            workers: self.workers.then(|| tooltune_driver::WorkerPolicy {
                max_attempts: self
                    .max_attempts
                    .unwrap_or(tooltune_driver::WorkerPolicy::default().max_attempts),
            }),
            minibatch: self.minibatch,
            patience: self.patience,
            score_threshold: self.score_threshold,
            rollouts_per_task: 1,
            batch: 8,
            agent,
            reflector,
            stop_file: None,
        })
    }
}

/// `POST /api/runs`: records a run and queues it; answers at once with its id.
pub(crate) async fn start_run(
    State(s): State<AppState>,
    body: Result<Json<StartRun>, axum::extract::rejection::JsonRejection>,
) -> Result<(StatusCode, Json<Value>), WebError> {
    let Json(req) = body.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => WebError::TooLarge {
            limit: s.cfg.max_json_bytes,
        },
        _ => WebError::BadRequest(e.body_text()),
    })?;
    let state = s.clone();
    // Loading a suite reads a file: off the async threads.
    let cfg = tokio::task::spawn_blocking(move || req.into_config(&state))
        .await
        .map_err(|e| WebError::Internal(format!("checking the run: {e}")))??;
    let id = s.jobs.create(&cfg).await?;
    let row = s
        .store
        .run(&id)
        .await?
        .ok_or_else(|| WebError::NotFound(format!("run `{id}`")))?;
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "run": view::brief(&row, &s.jobs),
            "links": links(&id),
        })),
    ))
}

fn links(id: &str) -> Value {
    json!({
        "self": format!("/api/runs/{id}"),
        "events": format!("/api/runs/{id}/events"),
        "stop": format!("/api/runs/{id}/stop"),
        "page": format!("/runs/{id}"),
    })
}

/// `GET /api/runs/{id}`.
pub(crate) async fn run(
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, WebError> {
    let detail = view::run_detail(&s, &id).await?;
    let mut v = serde_json::to_value(&detail)
        .map_err(|e| WebError::Internal(format!("serialising run `{id}`: {e}")))?;
    v["links"] = links(&id);
    Ok(Json(v))
}

/// `POST /api/runs/{id}/stop`: the run stops after its current step, then reports on what it found.
pub(crate) async fn stop_run(
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<Value>), WebError> {
    let row = s
        .store
        .run(&id)
        .await?
        .ok_or_else(|| WebError::NotFound(format!("run `{id}`")))?;
    if !s.jobs.stop(&id) {
        return Err(WebError::Conflict(format!(
            "run `{id}` is {} and not driven by this server",
            row.status
        )));
    }
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "run": view::brief(&row, &s.jobs), "stopping": true })),
    ))
}

/// `GET /api/trajectories/{id}`: one stored trajectory in tooltune's format.
pub(crate) async fn trajectory(
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, WebError> {
    let t = s
        .store
        .trajectory(&TrajectoryId::from_stored(id.clone()))
        .await?
        .ok_or_else(|| WebError::NotFound(format!("trajectory `{id}`")))?;
    Ok(Json(json!({ "id": id, "trajectory": t })))
}

/// Query of the report endpoints: run ids separated by commas.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReportQuery {
    pub(crate) runs: String,
}

impl ReportQuery {
    /// The run ids, without blanks; at most 20, which is more than a report can show side by side.
    pub(crate) fn ids(&self) -> Result<Vec<String>, WebError> {
        let ids: Vec<String> = self
            .runs
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        if ids.len() > 20 {
            return Err(WebError::BadRequest("at most 20 runs in one report".into()));
        }
        Ok(ids)
    }
}

/// `GET /api/report?runs=A,B`: the report's figures as JSON (what `tooltune report` writes beside its HTML).
pub(crate) async fn report(
    State(s): State<AppState>,
    query: Result<Query<ReportQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, WebError> {
    let Query(q) = query.map_err(|e| WebError::BadRequest(e.body_text()))?;
    let report = tooltune_report::Report::load(&s.store, &q.ids()?).await?;
    Ok(Json(report.to_json()))
}

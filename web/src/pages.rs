//! The HTML pages: home (tools and recent runs), a tool's description versions, a run with live progress, a
//! trajectory, and the static CSS and script. Templates are minijinja files compiled into the binary; they
//! auto-escape every value, and only HTML drawn by `tooltune-report` (which escapes its own text) is marked safe.

use crate::render;
use crate::view::{self, EvalPoint, RunDetail};
use crate::{AppState, WebError};
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use minijinja::{Environment, Value, context};
use serde::Serialize;
use serde_json::Value as Json;
use std::collections::{BTreeMap, HashMap};
use tooltune_core::{Step, TrajectoryId};
use tooltune_objectives::stats::Rate;
use tooltune_run::{OriginKind, ProgressCandidate as CandidateView, Status};

const TEMPLATES: &[(&str, &str)] = &[
    ("base.html", include_str!("../templates/base.html")),
    ("home.html", include_str!("../templates/home.html")),
    ("tool.html", include_str!("../templates/tool.html")),
    ("run.html", include_str!("../templates/run.html")),
    ("run_live.html", include_str!("../templates/run_live.html")),
    (
        "trajectory.html",
        include_str!("../templates/trajectory.html"),
    ),
    ("error.html", include_str!("../templates/error.html")),
    ("variants.html", include_str!("../templates/variants.html")),
    ("workers.html", include_str!("../templates/workers.html")),
];

/// The template environment with the filters the pages use.
pub(crate) fn templates() -> Result<Environment<'static>, WebError> {
    let mut env = Environment::new();
    // Optional data (a trajectory without links, a run without a checkpoint) is absent rather than null in the
    // serialised shapes; chained lookups on it are simply empty.
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Chainable);
    for (name, source) in TEMPLATES {
        env.add_template(name, source)?;
    }
    env.add_filter("rate", rate_filter);
    env.add_filter("pct", pct_filter);
    env.add_filter("num", num_filter);
    env.add_filter("short", short_filter);
    env.add_filter("one_line", one_line_filter);
    Ok(env)
}

/// `{{ r|rate }}`: a rate with its 95% interval and count, or a dash without trials.
fn rate_filter(r: Value) -> String {
    let get = |k: &str| r.get_attr(k).ok().and_then(|v| f64::try_from(v).ok());
    match get("value") {
        Some(v) => format!(
            "{:.0}% [{:.0}, {:.0}] n={}",
            v * 100.0,
            get("low").unwrap_or(0.0) * 100.0,
            get("high").unwrap_or(1.0) * 100.0,
            get("trials").unwrap_or(0.0)
        ),
        None => "–".into(),
    }
}

/// `{{ x|pct }}`: a share as a whole percentage.
fn pct_filter(v: Value) -> String {
    f64::try_from(v)
        .map(|x| format!("{:.0}%", x * 100.0))
        .unwrap_or_else(|_| "–".into())
}

/// `{{ x|num }}`: a number with three decimals.
fn num_filter(v: Value) -> String {
    f64::try_from(v)
        .map(|x| format!("{x:.3}"))
        .unwrap_or_else(|_| "–".into())
}

/// `{{ id|short }}`: the first 12 characters of an id.
fn short_filter(s: String) -> String {
    s.chars().take(12).collect()
}

/// `{{ text|one_line(80) }}`: whitespace collapsed and cut to a length with an ellipsis.
fn one_line_filter(s: String, max: Option<usize>) -> String {
    tooltune_core::text::one_line(&s, max.unwrap_or(100).max(2))
}

/// A page's error: the same [`WebError`], shown as HTML instead of JSON.
pub(crate) struct PageError(WebError);

impl From<WebError> for PageError {
    fn from(e: WebError) -> Self {
        PageError(e)
    }
}

impl From<tooltune_store::StoreError> for PageError {
    fn from(e: tooltune_store::StoreError) -> Self {
        PageError(e.into())
    }
}

impl From<minijinja::Error> for PageError {
    fn from(e: minijinja::Error) -> Self {
        PageError(e.into())
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        self.0.log();
        let status = self.0.status();
        let message = self.0.public_message();
        // Rendering the error page cannot use the shared environment (the state is not at hand here); a fresh one
        // with the error template alone is cheap and cannot fail on our own constant templates.
        let mut env = Environment::new();
        let body = env
            .add_template("base.html", include_str!("../templates/base.html"))
            .and_then(|_| env.add_template("error.html", include_str!("../templates/error.html")))
            .and_then(|_| env.get_template("error.html"))
            .and_then(|t| t.render(context! { status => status.as_u16(), message }))
            .unwrap_or_else(|_| "error".into());
        (status, Html(body)).into_response()
    }
}

type PageResult = Result<Html<String>, PageError>;

fn render(state: &AppState, name: &str, ctx: Value) -> PageResult {
    Ok(Html(state.templates.get_template(name)?.render(ctx)?))
}

/// Where a tool's success verdicts came from, in words ("12 from producers, 4 from a judge's labels"), or
/// nothing when every verdict is the producer's: labels are shown as labels, never passed off as outcomes.
fn verdict_sources(v: &tooltune_store::VerdictCounts) -> String {
    if v.judge.judged == 0 && v.heuristic.judged == 0 {
        return String::new();
    }
    let mut parts = vec![format!("{} from producers", v.producer.judged)];
    if v.judge.judged > 0 {
        parts.push(format!("{} from a judge's labels", v.judge.judged));
    }
    if v.heuristic.judged > 0 {
        parts.push(format!("{} from heuristic labels", v.heuristic.judged));
    }
    parts.join(", ")
}

/// `GET /`: the tools with their selection share and success, and the recent runs.
pub(crate) async fn home(State(s): State<AppState>) -> PageResult {
    // As `traces stats` counts by default: a stored label where the producer wrote no outcome, each verdict's
    // source shown beside the rate.
    let stats = s
        .store
        .tool_stats_with(None, tooltune_store::LabelUse::Use)
        .await?;
    let trajectories = s.store.count_trajectories().await?;
    // The total row of each tool, with how many description versions it has.
    let mut versions: BTreeMap<String, usize> = BTreeMap::new();
    for st in stats.iter().filter(|t| t.description_id.is_some()) {
        *versions.entry(st.tool.clone()).or_default() += 1;
    }
    let tools: Vec<Json> = stats
        .iter()
        .filter(|t| t.description_id.is_none())
        .map(|t| {
            serde_json::json!({
                "tool": t.tool,
                "shown": t.shown,
                "chosen": t.chosen,
                "selection_share": t.selection_share,
                "success_when_chosen": t.success_when_chosen,
                "verdict_sources": verdict_sources(&t.verdicts),
                "versions": versions.get(&t.tool).copied().unwrap_or(0),
            })
        })
        .collect();
    let runs: Vec<view::RunBrief> = s
        .store
        .runs(20)
        .await?
        .iter()
        .map(|r| view::brief(r, &s.jobs))
        .collect();
    let suites = {
        let dir = s.cfg.suites_dir.clone();
        tokio::task::spawn_blocking(move || crate::api::list_suites(&dir))
            .await
            .unwrap_or_default()
    };
    render(
        &s,
        "home.html",
        context! {
            trajectories,
            tools => Value::from_serialize(&tools),
            runs => Value::from_serialize(&runs),
            suites => Value::from_serialize(&suites),
            auth => s.cfg.token.is_some(),
        },
    )
}

/// `GET /tools/{name}`: each description version of a tool, how it fared, and recent trajectories that showed it.
pub(crate) async fn tool(State(s): State<AppState>, Path(name): Path<String>) -> PageResult {
    let stats = s
        .store
        .tool_stats_with(Some(&name), tooltune_store::LabelUse::Use)
        .await?;
    let Some(total) = stats.iter().find(|t| t.description_id.is_none()) else {
        return Err(WebError::NotFound(format!("tool `{name}`")).into());
    };
    let version_rows: Vec<_> = stats
        .iter()
        .filter(|t| t.description_id.is_some())
        .collect();
    // Versions are compared with the one shown most often: the description most traces were logged under.
    let main_text = version_rows
        .first()
        .and_then(|v| v.description.clone())
        .unwrap_or_default();
    let mut versions = Vec::new();
    let mut highlights = Vec::new();
    let mut diffs = Vec::new();
    for (i, v) in version_rows.iter().enumerate() {
        let id = v.description_id.clone().unwrap_or_default();
        let text = v.description.clone().unwrap_or_default();
        let schema = s
            .store
            .description(&tooltune_core::DescriptionId::from_stored(id.clone()))
            .await?
            .map(|d| (*d.input_schema).clone())
            .unwrap_or(Json::Null);
        // Highlights and diffs are drawn by the report crate, which escapes every piece of text it writes.
        let (highlight, inflation) = render::highlighted(&text, &name, &schema);
        highlights.push(Value::from_safe_string(highlight));
        diffs.push(if i > 0 {
            Value::from_safe_string(render::diff(&main_text, &text))
        } else {
            Value::from(())
        });
        versions.push(serde_json::json!({
            "id": id,
            "shown": v.shown,
            "chosen": v.chosen,
            "calls": v.calls,
            "selection_share": v.selection_share,
            "success_when_chosen": v.success_when_chosen,
            "text": text,
            "inflation": inflation.counts,
            "words": inflation.words,
        }));
    }
    let mut recent = Vec::new();
    for id in s.store.trajectory_ids(Some(&name), 25).await? {
        if let Some(t) = s.store.trajectory(&id).await? {
            recent.push(serde_json::json!({
                "id": id.as_str(),
                "task": t.task,
                "source": t.meta.source,
                "chose": t.calls_of(&name) > 0,
                "success": t.outcome.effective_success(),
                "run_id": t.links.run_id,
            }));
        }
    }
    render(
        &s,
        "tool.html",
        context! {
            tool => name,
            total => Value::from_serialize(total),
            verdict_sources => verdict_sources(&total.verdicts),
            versions => Value::from_serialize(&versions),
            highlights,
            diffs,
            recent => Value::from_serialize(&recent),
        },
    )
}

/// One description of a candidate, drawn.
#[derive(Serialize)]
struct ToolText {
    tool: String,
    text: String,
    changed: bool,
    words: usize,
    chars: usize,
    inflation: tooltune_objectives::InflationCounts,
}

/// A node of the lineage tree.
#[derive(Serialize)]
struct Node {
    id: u32,
    origin: OriginKind,
    tool: Option<String>,
    status: Status,
    validation_mean: Option<f64>,
    best: bool,
    on_frontier: bool,
    other_parents: Vec<u32>,
    children: Vec<Node>,
}

fn tree(candidates: &[CandidateView]) -> Vec<Node> {
    // Each candidate hangs under its first parent; a merge's second parent is named beside it.
    let mut children: HashMap<Option<u32>, Vec<&CandidateView>> = HashMap::new();
    for c in candidates {
        children
            .entry(c.candidate.parents.first().copied())
            .or_default()
            .push(c);
    }
    fn build(
        c: &CandidateView,
        children: &HashMap<Option<u32>, Vec<&CandidateView>>,
        depth: u32,
    ) -> Node {
        Node {
            id: c.candidate.id,
            origin: c.candidate.origin,
            tool: c.candidate.tool.clone(),
            status: c.candidate.status,
            validation_mean: c.candidate.validation_mean,
            best: c.best,
            on_frontier: c.on_frontier,
            other_parents: c.candidate.parents.iter().skip(1).copied().collect(),
            // Ids only grow from parent to child, so the depth is bounded by the candidates; the cap is a guard
            // against a corrupt checkpoint with a cycle.
            children: if depth > 256 {
                Vec::new()
            } else {
                children
                    .get(&Some(c.candidate.id))
                    .map(|v| v.iter().map(|k| build(k, children, depth + 1)).collect())
                    .unwrap_or_default()
            },
        }
    }
    children
        .get(&None)
        .map(|roots| roots.iter().map(|c| build(c, &children, 0)).collect())
        .unwrap_or_default()
}

/// The tools' input schemas as the run's server listed them, read back from one of its stored rollouts (the
/// inflation measure judges capability claims against the schema).
async fn run_schemas(
    s: &AppState,
    run_id: &str,
    candidates: &[CandidateView],
) -> Result<HashMap<String, Json>, WebError> {
    let Some(seed) = candidates.first() else {
        return Ok(HashMap::new());
    };
    let key = tooltune_run::candidate_key(&seed.candidate.descriptions);
    for row in s.store.rollouts(run_id, &key).await? {
        let Some(tid) = row.trajectory_id else {
            continue;
        };
        if let Some(t) = s.store.trajectory(&TrajectoryId::from_stored(tid)).await? {
            return Ok(t
                .tools
                .into_iter()
                .map(|t| (t.name, (*t.input_schema).clone()))
                .collect());
        }
    }
    Ok(HashMap::new())
}

fn candidate_views(detail: &RunDetail) -> Vec<CandidateView> {
    if let Some(p) = &detail.progress {
        return p.candidates.clone();
    }
    // A run without a checkpoint has no candidates yet.
    Vec::new()
}

/// The live part of the run page, as a template context.
async fn run_context(s: &AppState, id: &str) -> Result<Value, WebError> {
    let detail = view::run_detail(s, id).await?;
    let candidates = candidate_views(&detail);
    let tools: Vec<String> = detail
        .config
        .as_ref()
        .map(|c| c.tools.clone())
        .unwrap_or_default();
    let target = detail
        .config
        .as_ref()
        .map(|c| c.target.clone())
        .unwrap_or_default();
    let schemas = run_schemas(s, id, &candidates).await?;
    let by_id: HashMap<u32, &CandidateView> =
        candidates.iter().map(|c| (c.candidate.id, c)).collect();
    let last_validation: HashMap<u32, &EvalPoint> = detail
        .evaluations
        .iter()
        .filter(|e| e.phase == tooltune_run::Phase::VALIDATION)
        .map(|e| (e.candidate, e))
        .collect();
    let mut cards = Vec::new();
    for c in &candidates {
        let parent = c.candidate.parents.first().and_then(|p| by_id.get(p));
        let mut texts = Vec::new();
        let mut highlights = Vec::new();
        let mut diffs = Vec::new();
        for tool in &tools {
            let text = c
                .candidate
                .descriptions
                .get(tool)
                .cloned()
                .unwrap_or_default();
            let before = parent.and_then(|p| p.candidate.descriptions.get(tool));
            let changed = before.is_some_and(|b| *b != text);
            let schema = schemas.get(tool).cloned().unwrap_or(Json::Null);
            let (highlight, inflation) = render::highlighted(&text, tool, &schema);
            highlights.push(Value::from_safe_string(highlight));
            diffs.push(match before {
                Some(b) if changed => Value::from_safe_string(render::diff(b, &text)),
                _ => Value::from(()),
            });
            texts.push(ToolText {
                tool: tool.clone(),
                text,
                changed,
                words: inflation.words,
                chars: inflation.chars,
                inflation: inflation.counts,
            });
        }
        let key = tooltune_run::candidate_key(&c.candidate.descriptions);
        let rollouts: Vec<Json> = s
            .store
            .rollouts(id, &key)
            .await?
            .into_iter()
            .map(|r| {
                let result: Json = serde_json::from_str(&r.result).unwrap_or(Json::Null);
                serde_json::json!({
                    "task_id": r.task_id,
                    "rollout": r.rollout,
                    "success": result["success"],
                    "score": result["score"],
                    "called": result["called"],
                    "infra_failure": result["infra_failure"],
                    "trajectory_id": r.trajectory_id,
                })
            })
            .collect();
        let validation = last_validation.get(&c.candidate.id).map(|e| {
            serde_json::json!({ "success": e.success, "selection": e.selection, "off_target": e.off_target })
        });
        cards.push(context! {
            c => Value::from_serialize(c),
            texts => Value::from_serialize(&texts),
            highlights,
            diffs,
            rollouts => Value::from_serialize(&rollouts),
            validation => Value::from_serialize(&validation),
        });
    }
    let (success_chart, selection_chart) =
        render::score_charts(&detail.evaluations, &target, detail.run.budget_rollouts);
    let frontier: Vec<Json> = candidates
        .iter()
        .filter(|c| c.on_frontier)
        .map(|c| {
            let v = last_validation.get(&c.candidate.id);
            serde_json::json!({
                "id": c.candidate.id,
                "wins": c.frontier_wins,
                "validation_mean": c.candidate.validation_mean,
                "success": v.map(|e| &e.success),
                "selection": v.map(|e| &e.selection),
                "best": c.best,
            })
        })
        .collect();
    let budget = detail.run.budget_rollouts.unwrap_or(0);
    let spent = detail.progress.as_ref().map(|p| p.rollouts).unwrap_or(0);
    let percent = if budget > 0 {
        ((spent as f64 / budget as f64) * 100.0).min(100.0)
    } else {
        0.0
    };
    let test: Option<Json> = detail.result.as_ref().map(|r| {
        let t = &r.test;
        let row = |name: &str, a: &Rate, b: &Rate, p: Option<f64>| {
            serde_json::json!({ "name": name, "seed": a, "winner": b, "p": p })
        };
        serde_json::json!({
            "split": t.split,
            "tasks": t.seed.tasks,
            "rows": [
                row("task success", &t.seed.success, &t.winner.success, Some(t.success_p_value)),
                row(&format!("selection rate of {}", r.target), &t.seed.selection, &t.winner.selection, Some(t.selection_p_value)),
                row("off-target choice", &t.seed.off_target, &t.winner.off_target, None),
            ],
            "winner": r.winner,
            "stop_reason": r.stop_reason,
            "rollouts": r.spent.rollouts,
            "wall_s": r.wall_s,
        })
    });
    Ok(context! {
        run => Value::from_serialize(&detail.run),
        config => Value::from_serialize(&detail.config),
        progress => Value::from_serialize(&detail.progress),
        spent,
        budget,
        percent,
        events => detail.events,
        tree => Value::from_serialize(tree(&candidates)),
        frontier => Value::from_serialize(&frontier),
        cards,
        success_chart => Value::from_safe_string(success_chart),
        selection_chart => Value::from_safe_string(selection_chart),
        test => Value::from_serialize(&test),
        live => matches!(detail.run.status.as_str(), "queued" | "running"),
    })
}

/// `GET /runs/{id}`: the run page (its live part refreshes itself from the event stream).
pub(crate) async fn run(State(s): State<AppState>, Path(id): Path<String>) -> PageResult {
    let ctx = run_context(&s, &id).await?;
    render(&s, "run.html", ctx)
}

/// `GET /runs/{id}/live`: the live part of the run page alone, which the page's script swaps in.
pub(crate) async fn run_live(State(s): State<AppState>, Path(id): Path<String>) -> PageResult {
    let ctx = run_context(&s, &id).await?;
    render(&s, "run_live.html", ctx)
}

/// One step of a trajectory, for the viewer.
#[derive(Serialize)]
struct StepView {
    kind: &'static str,
    content: Option<String>,
    calls: Vec<(String, Option<String>, String)>,
    name: Option<String>,
    call_id: Option<String>,
    is_error: bool,
    tokens: Option<(u64, u64)>,
    duration_ms: Option<f64>,
}

/// `GET /trajectories/{id}`: the steps, tool calls and results of one trajectory.
pub(crate) async fn trajectory(State(s): State<AppState>, Path(id): Path<String>) -> PageResult {
    let t = s
        .store
        .trajectory(&TrajectoryId::from_stored(id.clone()))
        .await?
        .ok_or_else(|| WebError::NotFound(format!("trajectory `{id}`")))?;
    let steps: Vec<StepView> = t
        .steps
        .iter()
        .map(|step| match step {
            Step::User { content } => StepView {
                kind: "user",
                content: Some(content.clone()),
                calls: vec![],
                name: None,
                call_id: None,
                is_error: false,
                tokens: None,
                duration_ms: None,
            },
            Step::Model {
                content,
                tool_calls,
                timing,
                usage,
            } => StepView {
                kind: "model",
                content: content.clone(),
                calls: tool_calls
                    .iter()
                    .map(|c| {
                        (
                            c.name.clone(),
                            c.id.clone(),
                            serde_json::to_string_pretty(&c.arguments).unwrap_or_default(),
                        )
                    })
                    .collect(),
                name: None,
                call_id: None,
                is_error: false,
                tokens: usage
                    .as_ref()
                    .map(|u| (u.prompt_tokens, u.completion_tokens)),
                duration_ms: timing.duration_ms,
            },
            Step::ToolResult {
                call_id,
                name,
                content,
                is_error,
                timing,
            } => StepView {
                kind: "tool_result",
                content: Some(content.clone()),
                calls: vec![],
                name: Some(name.clone()),
                call_id: call_id.clone(),
                is_error: *is_error,
                tokens: None,
                duration_ms: timing.duration_ms,
            },
        })
        .collect();
    let called: Vec<String> = t
        .tools
        .iter()
        .filter(|tool| t.calls_of(&tool.name) > 0)
        .map(|tool| tool.name.clone())
        .collect();
    render(
        &s,
        "trajectory.html",
        context! {
            id,
            t => Value::from_serialize(&t),
            success => t.outcome.effective_success(),
            steps => Value::from_serialize(&steps),
            called,
        },
    )
}

/// `GET /report?runs=A,B`: the report of runs (the contractor report of `tooltune demo`: the same seed optimised
/// for task success and for selection rate, side by side), as the report crate renders it.
pub(crate) async fn report(
    State(s): State<AppState>,
    query: Result<
        axum::extract::Query<crate::api::ReportQuery>,
        axum::extract::rejection::QueryRejection,
    >,
) -> Result<Html<String>, PageError> {
    let axum::extract::Query(q) = query.map_err(|e| WebError::BadRequest(e.body_text()))?;
    let report = tooltune_report::Report::load(&s.store, &q.ids()?)
        .await
        .map_err(WebError::from)?;
    Ok(Html(report.to_html()))
}

/// `GET /runs/{id}/report`: the report of one run.
pub(crate) async fn run_report(
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Result<Html<String>, PageError> {
    let report = tooltune_report::Report::load(&s.store, &[id])
        .await
        .map_err(WebError::from)?;
    Ok(Html(report.to_html()))
}

fn static_file(body: &'static str, content_type: &'static str) -> Response {
    let mut r = (StatusCode::OK, body).into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=300"),
    );
    r
}

/// `GET /static/app.css`.
pub(crate) async fn css() -> Response {
    static_file(include_str!("../static/app.css"), "text/css; charset=utf-8")
}

/// `GET /static/app.js`.
pub(crate) async fn js() -> Response {
    static_file(
        include_str!("../static/app.js"),
        "text/javascript; charset=utf-8",
    )
}

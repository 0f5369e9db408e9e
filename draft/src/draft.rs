//! `suite draft`: explore a server, draft requests with a model, verify each on the server, and write the suite
//! and its review page.
//!
//! The stages, each a batch of model work between server calls:
//! 1. **Explore.** The read-only tools (declared, or by their names when the server declares nothing) are called:
//!    the ones that need no argument with none, then the others with arguments the model writes (a forced call,
//!    so the arguments follow the schema) after seeing what the first ones returned. What they return is what the
//!    drafted requests may name.
//! 2. **Draft.** Per tool, N requests from the tool's name, parameters and the exploration results; per pair of
//!    confusable tools, requests that need one and not the other; and requests no tool serves.
//! 3. **Verify.** The model writes each request's reference call (forced to the owner), tooltune runs it (on a
//!    fresh fixture copy for a tool that may write) and again (the second result tells a stable value from a
//!    changing one), and the model says whether the result gives what was asked and which words of it do. A task
//!    is kept when the call succeeds and the result answers it; it gets an answer check when that value is short,
//!    in both results, and a number, name or date, else it checks routing only.
//!
//! Ctrl-C (the stop flag) ends the current batch; what was verified by then is written.

use crate::parse::{self, Check, LineRejection, NoCheck};
use crate::prompt::{self, ObservationView, ToolView};
use crate::tools::{self, Access};
use crate::{DraftError, split, write};
use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tooltune_core::ToolSpec;
use tooltune_evaluator::fixture::{Fixture, Workspace};
use tooltune_evaluator::{
    EvalError, McpServer, ReferenceCall, ServerSpec, Split, Suite, Transport,
};
use tooltune_llm::{ChatModel, ChatRequest, Message, ToolChoice};

/// How many requests of each kind to draft.
#[derive(Debug, Clone)]
pub struct Counts {
    /// Requests per tool.
    pub per_tool: usize,
    /// Requests no tool serves.
    pub no_tool: usize,
    /// Pairs of confusable tools drafted against each other.
    pub pairs: usize,
    /// Requests per direction of a pair.
    pub per_pair: usize,
}

impl Counts {
    /// The defaults for `per_tool` requests a tool: half as many no-tool requests (at least 2), two confusable
    /// pairs with a third as many each way (at least 1).
    pub fn for_per_tool(per_tool: usize) -> Counts {
        Counts {
            per_tool,
            no_tool: (per_tool / 2).max(2),
            pairs: 2,
            per_pair: (per_tool / 3).max(1),
        }
    }
}

/// What to draft, for which server, into which file.
#[derive(Debug, Clone)]
pub struct DraftConfig {
    /// The server as given (`${FIXTURE_DIR}` may stand in its command line).
    pub server: ServerSpec,
    /// A folder or file copied for every call of a tool that may write (and for exploration).
    pub fixture: Option<PathBuf>,
    /// The suite file to write.
    pub out: PathBuf,
    /// The suite's name (default: the file name).
    pub name: Option<String>,
    /// How many requests to draft.
    pub counts: Counts,
    /// Seeds drafting (sampling) and the splits.
    pub seed: u64,
    /// How long one reference or exploration call may take.
    pub call_timeout: Duration,
    /// Add to the suite at `out` instead of writing a new one: tasks already there are kept as they are and no
    /// drafted request repeats one of them.
    pub more: bool,
}

/// Progress: the stage, and units done of the total known so far (the total grows once drafting has made the
/// tasks to verify).
#[derive(Debug, Clone)]
pub struct Progress {
    /// `exploring`, `drafting`, `verifying`, `writing`.
    pub stage: &'static str,
    /// Units done.
    pub done: usize,
    /// Units known.
    pub total: usize,
}

/// What a drafted task was drafted as.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Kind {
    /// A request for its owner.
    Tool,
    /// A request no tool serves.
    NoTool,
    /// A request for its owner that sits close to `against`.
    Confusable {
        /// The other tool of the pair.
        against: String,
    },
}

impl Kind {
    /// The provenance word.
    pub fn name(&self) -> &'static str {
        match self {
            Kind::Tool => "tool",
            Kind::NoTool => "no-tool",
            Kind::Confusable { .. } => "confusable",
        }
    }

    /// The other tool of a confusable pair.
    pub fn against(&self) -> Option<&str> {
        match self {
            Kind::Confusable { against } => Some(against),
            _ => None,
        }
    }
}

/// What a kept task checks.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskCheck {
    /// An answer check from the reference result.
    Answer(Check),
    /// Only the tool called (the owner, or none); why there is no answer check.
    Routing(String),
}

/// A task that passed verification.
#[derive(Debug, Clone, Serialize)]
pub struct Kept {
    /// Its id.
    pub id: String,
    /// The request.
    pub prompt: String,
    /// Its split.
    pub split: Split,
    /// The tool it belongs to; `None` for a no-tool request.
    pub owner: Option<String>,
    /// What it was drafted as.
    pub kind: Kind,
    /// Its check.
    pub check: TaskCheck,
    /// The reference call.
    pub reference: Option<ReferenceCall>,
    /// The start of the reference result, for the review page.
    pub result_start: Option<String>,
    /// `sha256:` and the digest of the reference result's text.
    pub digest: Option<String>,
    /// The drafting model's id.
    pub model: String,
}

/// Why a drafted task was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DropReason {
    /// The same request as another, or as a task already in the suite.
    Duplicate,
    /// Too short, too long, or it names a tool.
    Malformed,
    /// The model wrote no call for it.
    NoCall,
    /// The tool may write and no fixture was given, so it was not called.
    WritesWithoutFixture,
    /// The server refused the call (unknown tool, invalid arguments).
    Rejected,
    /// The tool answered with an error (`isError`).
    ToolError,
    /// The call did not answer in time.
    Timeout,
    /// The server died or the transport failed during the call.
    ServerFailed,
    /// The call returned nothing.
    EmptyResult,
    /// The model judged that the result does not give what was asked.
    NotAnswered,
    /// The model's verdict could not be read, twice.
    UnreadableVerdict,
    /// Drafting was stopped (Ctrl-C) before this task was verified.
    Stopped,
}

impl DropReason {
    /// The reason as a key (`tool-error`).
    pub fn key(self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    }
}

/// A drafted task that was not kept.
#[derive(Debug, Clone, Serialize)]
pub struct Dropped {
    /// The request.
    pub prompt: String,
    /// The tool it was drafted for.
    pub owner: Option<String>,
    /// What it was drafted as.
    pub kind: Kind,
    /// Why it was dropped.
    pub reason: DropReason,
    /// The details (the server's message, the timeout).
    pub detail: String,
    /// The reference call, when one was written.
    pub reference: Option<ReferenceCall>,
    /// The start of its result, when it ran.
    pub result_start: Option<String>,
}

/// One exploration call.
#[derive(Debug, Clone, Serialize)]
pub struct Observation {
    /// The tool called.
    pub tool: String,
    /// Its arguments.
    pub arguments: Value,
    /// The text it returned (cut), or the error.
    pub result: String,
    /// Whether it failed.
    pub failed: bool,
}

/// The outcome of `suite draft`.
#[derive(Debug, Clone, Serialize)]
pub struct DraftOutcome {
    /// The suite written, or `None` when nothing was kept.
    pub suite: Option<PathBuf>,
    /// The review page as Markdown.
    pub review_md: PathBuf,
    /// The review page as HTML.
    pub review_html: PathBuf,
    /// The drafting model.
    pub model: String,
    /// The server's tools with their access.
    pub tools: Vec<(String, Access)>,
    /// The exploration calls.
    pub explored: Vec<Observation>,
    /// Tasks the suite held before (`--more`).
    pub existing: usize,
    /// Tasks kept (the new ones).
    pub kept: Vec<Kept>,
    /// Tasks dropped, with reasons.
    pub dropped: Vec<Dropped>,
    /// Whether drafting was stopped early.
    pub stopped: bool,
    /// Wall time in seconds.
    pub seconds: f64,
}

impl DraftOutcome {
    /// Drafted requests in all (kept and dropped).
    pub fn drafted(&self) -> usize {
        self.kept.len() + self.dropped.len()
    }

    /// Dropped tasks per reason.
    pub fn dropped_by_reason(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for d in &self.dropped {
            *m.entry(d.reason.key()).or_insert(0) += 1;
        }
        m
    }

    /// Kept tasks with an answer check.
    pub fn answer_checked(&self) -> usize {
        self.kept
            .iter()
            .filter(|k| matches!(k.check, TaskCheck::Answer(_)))
            .count()
    }

    /// The summary `--json` prints.
    pub fn summary(&self) -> Value {
        let mut per_tool: BTreeMap<String, [usize; 2]> = BTreeMap::new();
        for k in &self.kept {
            per_tool
                .entry(k.owner.clone().unwrap_or_else(|| "(no tool)".into()))
                .or_default()[0] += 1;
        }
        for d in &self.dropped {
            per_tool
                .entry(d.owner.clone().unwrap_or_else(|| "(no tool)".into()))
                .or_default()[1] += 1;
        }
        json!({
            "suite": self.suite,
            "review_md": self.review_md,
            "review_html": self.review_html,
            "model": self.model,
            "tools": self.tools.iter().map(|(n, a)| json!({"name": n, "access": a})).collect::<Vec<_>>(),
            "explored": self.explored.len(),
            "existing": self.existing,
            "drafted": self.drafted(),
            "kept": self.kept.len(),
            "answer_checked": self.answer_checked(),
            "routing_only": self.kept.len() - self.answer_checked(),
            "dropped": self.dropped.len(),
            "dropped_by_reason": self.dropped_by_reason(),
            "per_tool": per_tool.iter().map(|(t, [k, d])| json!({"tool": t, "kept": k, "dropped": d})).collect::<Vec<_>>(),
            "stopped": self.stopped,
            "seconds": (self.seconds * 10.0).round() / 10.0,
        })
    }
}

/// How much of a result the prompts show, in characters.
const RESULT_IN_PROMPT: usize = 500;
/// How much of a result the review page shows.
const RESULT_IN_REVIEW: usize = 240;
/// How many exploration results a prompt shows.
const OBSERVATIONS_IN_PROMPT: usize = 6;
/// How many requests the model decodes together.
const BATCH: usize = 4;
/// Exploration calls at most.
const MAX_EXPLORED: usize = 12;

/// A drafted request waiting for verification.
#[derive(Debug, Clone)]
struct Candidate {
    prompt: String,
    owner: Option<String>,
    kind: Kind,
}

/// Runs `suite draft`. `progress` is called as work is done; `stop` ends the run after the current batch, keeping
/// what was verified.
pub async fn draft(
    cfg: &DraftConfig,
    model: &dyn ChatModel,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(&Progress),
) -> Result<DraftOutcome, DraftError> {
    let started = Instant::now();
    let existing = if cfg.more {
        Some(Suite::load(&cfg.out).map_err(DraftError::Existing)?)
    } else {
        None
    };
    let fixture = match &cfg.fixture {
        Some(p) => {
            let abs = p.canonicalize().map_err(|e| DraftError::Fixture {
                path: p.clone(),
                message: e.to_string(),
            })?;
            Some(Fixture::load(abs).map_err(|e| DraftError::Fixture {
                path: p.clone(),
                message: e.to_string(),
            })?)
        }
        None => None,
    };
    let fixture_named = serde_json::to_string(&cfg.server.transport)
        .unwrap_or_default()
        .contains(tooltune_evaluator::fixture::FIXTURE_VAR);
    match (&fixture, fixture_named) {
        (Some(_), false) => return Err(DraftError::FixtureUnused),
        (None, true) => return Err(DraftError::FixtureMissing),
        _ => {}
    }

    let spec = effective_spec(&cfg.server, fixture.is_some());
    // The server exploration and read-only reference calls run on: the live server, or one fixture copy.
    let main = Main::open(&spec, fixture.as_ref()).await?;
    let all_tools = main
        .server()
        .list_tools()
        .await
        .map_err(|e| start_error(&spec, e))?;
    if all_tools.is_empty() {
        main.close().await;
        return Err(DraftError::NoTools {
            server: command_line(&cfg.server),
        });
    }
    let hints = main.server().hints();
    let access = tools::access_map(&all_tools, &hints);
    let protocol = main.server().negotiated_protocol();
    let tool_names: Vec<String> = all_tools.iter().map(|t| t.name.clone()).collect();

    let pairs = tools::confusable_pairs(&all_tools, cfg.counts.pairs);
    let explorable: Vec<&ToolSpec> = {
        let mut v: Vec<&ToolSpec> = all_tools
            .iter()
            .filter(|t| access[&t.name].explorable())
            .collect();
        v.sort_by_key(|t| (tools::required_count(&t.input_schema), t.name.clone()));
        v.truncate(MAX_EXPLORED);
        v
    };
    let drafting_prompts = all_tools.len() + 2 * pairs.len() + usize::from(cfg.counts.no_tool > 0);
    let mut p = Progress {
        stage: "exploring",
        done: 0,
        total: explorable.len() + drafting_prompts,
    };
    progress(&p);

    // 1. Explore.
    let explored = explore(cfg, model, main.server(), &explorable, &mut p, progress).await?;
    let observations: Vec<&Observation> = explored.iter().filter(|o| !o.failed).collect();

    // 2. Draft.
    p.stage = "drafting";
    progress(&p);
    let (candidates, mut dropped, any_reply) = draft_requests(
        cfg,
        model,
        &all_tools,
        &pairs,
        &observations,
        existing.as_ref(),
        stop,
        &mut p,
        progress,
    )
    .await?;
    if candidates.is_empty() && stop.load(Ordering::SeqCst) {
        main.close().await;
        return Err(DraftError::Stopped);
    }
    if candidates.is_empty() && !any_reply {
        main.close().await;
        return Err(DraftError::NothingParseable {
            model: model.id(),
            sample: dropped
                .first()
                .map(|d| d.prompt.clone())
                .unwrap_or_default(),
        });
    }

    // 3. Verify.
    p.stage = "verifying";
    p.total += candidates.len();
    progress(&p);
    let ctx = VerifyCtx {
        cfg,
        spec: &spec,
        model,
        main: main.server(),
        fixture: fixture.as_ref(),
        tools: &all_tools,
        access: &access,
        observations: &observations,
    };
    let (verified, more_dropped, stopped) = verify(&ctx, candidates, stop, &mut p, progress).await;
    dropped.extend(more_dropped);
    main.close().await;

    // Ids and splits.
    let existing_ids: BTreeSet<String> = existing
        .as_ref()
        .map(|s| s.tasks.iter().map(|t| t.id.clone()).collect())
        .unwrap_or_default();
    let mut existing_counts: BTreeMap<Option<String>, split::Counts> = BTreeMap::new();
    if let Some(s) = &existing {
        for t in &s.tasks {
            *existing_counts
                .entry(t.owner.clone())
                .or_default()
                .entry(t.split)
                .or_default() += 1;
        }
    }
    let owners: Vec<Option<String>> = verified.iter().map(|v| v.owner.clone()).collect();
    let splits = split::assign(&owners, &existing_counts, cfg.seed);
    let mut used = existing_ids;
    let kept: Vec<Kept> = verified
        .into_iter()
        .zip(splits)
        .map(|(mut k, s)| {
            k.split = s;
            k.id = unique_id(&k, &mut used);
            k
        })
        .collect();

    // 4. Write.
    p.stage = "writing";
    progress(&p);
    let review_md = cfg.out.with_extension("review.md");
    let review_html = cfg.out.with_extension("review.html");
    let mut outcome = DraftOutcome {
        suite: None,
        review_md: review_md.clone(),
        review_html: review_html.clone(),
        model: model.id(),
        tools: tool_names.iter().map(|n| (n.clone(), access[n])).collect(),
        explored,
        existing: existing.as_ref().map_or(0, |s| s.tasks.len()),
        kept,
        dropped,
        stopped,
        seconds: 0.0,
    };
    if !outcome.kept.is_empty() {
        let text = suite_text(
            cfg,
            &outcome,
            &tool_names,
            protocol.as_deref(),
            fixture.as_ref(),
        )?;
        // Read back before writing: a file the loader refuses is never written.
        Suite::parse(&cfg.out, &text).map_err(|e| {
            DraftError::Internal(format!(
                "the drafted suite does not load ({e}); this is a bug in suite draft"
            ))
        })?;
        write::atomically(&cfg.out, &text)?;
        outcome.suite = Some(cfg.out.clone());
    }
    outcome.seconds = started.elapsed().as_secs_f64();
    let title = cfg.name.clone().unwrap_or_else(|| file_stem(&cfg.out));
    write::atomically(&review_md, &crate::review::markdown(&title, &outcome))?;
    write::atomically(&review_html, &crate::review::html(&title, &outcome))?;
    if outcome.kept.is_empty() {
        return Err(DraftError::NothingKept {
            reasons: outcome
                .dropped_by_reason()
                .iter()
                .map(|(r, n)| format!("{n} {r}"))
                .collect::<Vec<_>>()
                .join(", "),
            // A failure of verification says more than a line the parser refused.
            first: outcome
                .dropped
                .iter()
                .find(|d| !matches!(d.reason, DropReason::Duplicate | DropReason::Malformed))
                .or(outcome.dropped.first())
                .map(|d| format!("{}: {}", d.reason.key(), d.detail))
                .unwrap_or_default(),
            review: review_md,
        });
    }
    Ok(outcome)
}

fn file_stem(p: &Path) -> String {
    p.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "drafted".into())
}

/// The spec drafting starts servers with. With a fixture the server runs in its copy (`cwd = ${FIXTURE_DIR}`, as
/// the written suite says, so relative paths in tool results mean the same in eval), and arguments that name
/// existing paths are made absolute first, since they were given relative to where tooltune runs.
fn effective_spec(spec: &ServerSpec, fixture: bool) -> ServerSpec {
    let mut out = spec.clone();
    if let (
        true,
        Transport::Stdio {
            command, args, cwd, ..
        },
    ) = (fixture, &mut out.transport)
    {
        let abs = |w: &mut String| {
            if !w.contains("${")
                && w.contains('/')
                && let Ok(p) = Path::new(w.as_str()).canonicalize()
            {
                *w = p.to_string_lossy().into_owned();
            }
        };
        abs(command);
        args.iter_mut().for_each(abs);
        if cwd.is_none() {
            *cwd = Some(PathBuf::from(tooltune_evaluator::fixture::FIXTURE_VAR));
        }
    }
    out
}

/// The live server, or the fixture copy the read-only calls share.
enum Main {
    Live(McpServer),
    Copy(Workspace),
}

impl Main {
    async fn open(spec: &ServerSpec, fixture: Option<&Fixture>) -> Result<Main, DraftError> {
        match fixture {
            None => McpServer::connect(spec.clone())
                .await
                .map(Main::Live)
                .map_err(|e| start_error(spec, e)),
            Some(f) => Workspace::open(f, spec, None)
                .await
                .map(Main::Copy)
                .map_err(|e| start_error(spec, e)),
        }
    }

    fn server(&self) -> &McpServer {
        match self {
            Main::Live(s) => s,
            Main::Copy(w) => &w.server,
        }
    }

    async fn close(self) {
        match self {
            Main::Live(s) => s.shutdown().await,
            Main::Copy(w) => w.close().await,
        }
    }
}

/// The command line of a spec, for messages.
pub fn command_line(spec: &ServerSpec) -> String {
    match &spec.transport {
        Transport::Stdio { command, args, .. } => std::iter::once(command.as_str())
            .chain(args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" "),
        Transport::Http { url, .. } => url.clone(),
        Transport::Catalog { tools } => format!("a catalog of {} declared tools", tools.len()),
    }
}

fn start_error(spec: &ServerSpec, e: EvalError) -> DraftError {
    DraftError::ServerStart {
        command: command_line(spec),
        message: e.to_string(),
    }
}

fn cut_result(text: &str, max: usize) -> String {
    tools::cut(text.trim(), max)
}

fn observation_views(obs: &[&Observation], first: Option<&str>) -> Vec<ObservationView> {
    // The tool's own results first, then the others', up to the limit.
    let mut v: Vec<&&Observation> = obs.iter().collect();
    v.sort_by_key(|o| Some(o.tool.as_str()) != first);
    v.into_iter()
        .take(OBSERVATIONS_IN_PROMPT)
        .map(|o| ObservationView {
            tool: o.tool.clone(),
            arguments: plain_arguments(&o.arguments),
            // On one line: a listing's line breaks inside a data block read as the prompt's own structure.
            result: cut_result(
                &o.result.split_whitespace().collect::<Vec<_>>().join(" "),
                RESULT_IN_PROMPT,
            ),
        })
        .collect()
}

/// Arguments as `key: value` pairs, the way a person would read them: JSON in the prompt was copied into drafted
/// requests by the small models.
fn plain_arguments(args: &Value) -> String {
    match args {
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => format!("{k}: {s}"),
                other => format!("{k}: {other}"),
            })
            .collect::<Vec<_>>()
            .join(", "),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn system() -> Result<Message, DraftError> {
    Ok(Message::system(prompt::render("system.jinja", json!({}))?))
}

/// A forced call of `tool`: the model writes only its arguments, under the schema's grammar.
fn call_request(tool: &ToolSpec, system_text: String, user: String) -> ChatRequest {
    let mut r = ChatRequest::new(
        vec![Message::system(system_text), Message::user(user)],
        vec![tool.clone()],
    );
    r.tool_choice = ToolChoice::Tool(tool.name.clone());
    r.max_tokens = 200;
    r
}

/// Simple arguments from a schema when the model wrote none: each required parameter an empty value of its type.
fn default_arguments(schema: &Value) -> Value {
    let mut m = serde_json::Map::new();
    for p in tools::params(schema).into_iter().filter(|p| p.required) {
        let v = match p.r#type.split_whitespace().next().unwrap_or("") {
            "integer" | "number" => json!(1),
            "boolean" => json!(false),
            "array" => json!([]),
            "object" => json!({}),
            _ => json!(""),
        };
        m.insert(p.name, v);
    }
    Value::Object(m)
}

async fn explore(
    cfg: &DraftConfig,
    model: &dyn ChatModel,
    server: &McpServer,
    explorable: &[&ToolSpec],
    p: &mut Progress,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Vec<Observation>, DraftError> {
    let mut out: Vec<Observation> = Vec::new();
    let (free, needing): (Vec<&ToolSpec>, Vec<&ToolSpec>) = explorable
        .iter()
        .copied()
        .partition(|t| tools::required_count(&t.input_schema) == 0);
    for t in free {
        out.push(observe(cfg, server, &t.name, json!({})).await);
        p.done += 1;
        progress(p);
    }
    if needing.is_empty() {
        return Ok(out);
    }
    let ok: Vec<&Observation> = out.iter().filter(|o| !o.failed).collect();
    let reqs: Vec<ChatRequest> = needing
        .iter()
        .map(|t| {
            Ok(call_request(
                t,
                prompt::render(
                    "explore.jinja",
                    json!({"observations": observation_views(&ok, Some(&t.name))}),
                )?,
                format!("Call {} once to see what it returns.", t.name),
            ))
        })
        .collect::<Result<_, DraftError>>()?;
    let replies = model.chat_many(&reqs).await;
    for (t, reply) in needing.iter().zip(replies) {
        let args = reply
            .ok()
            .and_then(|r| r.tool_calls.into_iter().find(|c| c.name == t.name))
            .map(|c| c.arguments)
            .filter(Value::is_object)
            .unwrap_or_else(|| default_arguments(&t.input_schema));
        out.push(observe(cfg, server, &t.name, args).await);
        p.done += 1;
        progress(p);
    }
    Ok(out)
}

async fn observe(cfg: &DraftConfig, server: &McpServer, tool: &str, args: Value) -> Observation {
    let (result, failed) = match server.call_tool(tool, args.clone(), cfg.call_timeout).await {
        Ok(o) => (
            cut_result(&o.content_text, 2000),
            o.is_error || o.content_text.trim().is_empty(),
        ),
        Err(e) => {
            // A dead server is restarted so the rest of the drafting can use it.
            if e.is_infrastructure() {
                let _ = server.ensure_connected().await;
            }
            (e.to_string(), true)
        }
    };
    Observation {
        tool: tool.to_string(),
        arguments: args,
        result,
        failed,
    }
}

#[allow(clippy::too_many_arguments)]
async fn draft_requests(
    cfg: &DraftConfig,
    model: &dyn ChatModel,
    all_tools: &[ToolSpec],
    pairs: &[(String, String, f64)],
    observations: &[&Observation],
    existing: Option<&Suite>,
    stop: &AtomicBool,
    p: &mut Progress,
    progress: &mut dyn FnMut(&Progress),
) -> Result<(Vec<Candidate>, Vec<Dropped>, bool), DraftError> {
    let sys = system()?;
    let by_name: BTreeMap<&str, &ToolSpec> =
        all_tools.iter().map(|t| (t.name.as_str(), t)).collect();
    // (request, owner, kind) of each prompt.
    let mut jobs: Vec<(ChatRequest, Option<String>, Kind, usize)> = Vec::new();
    let sample = |text: String, n: usize, salt: &str| {
        let mut r = ChatRequest::text(vec![sys.clone(), Message::user(text)]);
        // Sampled, seeded: greedy decoding repeats one phrasing; the seed makes the run repeatable.
        r.temperature = 0.7;
        r.seed = Some(cfg.seed ^ salt_of(salt));
        r.max_tokens = (60 * n as u32 + 40).min(1200);
        r
    };
    if cfg.counts.per_tool > 0 {
        for t in all_tools {
            let text = prompt::render(
                "requests.jinja",
                json!({"tool": ToolView::of(t), "observations": observation_views(observations, Some(&t.name)),
                       "n": cfg.counts.per_tool}),
            )?;
            jobs.push((
                sample(text, cfg.counts.per_tool, &t.name),
                Some(t.name.clone()),
                Kind::Tool,
                cfg.counts.per_tool,
            ));
        }
    }
    if cfg.counts.per_pair > 0 {
        for (a, b, _) in pairs {
            for (x, y) in [(a, b), (b, a)] {
                let text = prompt::render(
                    "confusable.jinja",
                    json!({"tool": ToolView::of(by_name[x.as_str()]), "other": ToolView::of(by_name[y.as_str()]),
                           "observations": observation_views(observations, Some(x)), "n": cfg.counts.per_pair}),
                )?;
                jobs.push((
                    sample(text, cfg.counts.per_pair, &format!("{x}\0{y}")),
                    Some(x.clone()),
                    Kind::Confusable { against: y.clone() },
                    cfg.counts.per_pair,
                ));
            }
        }
    }
    if cfg.counts.no_tool > 0 {
        let views: Vec<ToolView> = all_tools.iter().map(ToolView::of).collect();
        let text = prompt::render(
            "no_tool.jinja",
            json!({"tools": views, "n": cfg.counts.no_tool}),
        )?;
        jobs.push((
            sample(text, cfg.counts.no_tool, "\0no tool"),
            None,
            Kind::NoTool,
            cfg.counts.no_tool,
        ));
    }

    let names: Vec<&str> = all_tools.iter().map(|t| t.name.as_str()).collect();
    let mut seen: Vec<String> = existing
        .map(|s| s.tasks.iter().map(|t| t.prompt.clone()).collect())
        .unwrap_or_default();
    let mut candidates = Vec::new();
    let mut dropped = Vec::new();
    let mut any = false;
    let mut first_reply = None;
    for chunk in jobs.chunks(BATCH) {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let reqs: Vec<ChatRequest> = chunk.iter().map(|j| j.0.clone()).collect();
        let replies = model.chat_many(&reqs).await;
        for ((_, owner, kind, n), reply) in chunk.iter().zip(replies) {
            let text = match reply {
                Ok(r) => r.content.unwrap_or_default(),
                Err(e) => return Err(DraftError::Model(e.to_string())),
            };
            first_reply.get_or_insert_with(|| text.clone());
            let (requests, refused) = parse::requests(&text, &names);
            any |= !requests.is_empty();
            for (line, why) in refused {
                dropped.push(Dropped {
                    prompt: line,
                    owner: owner.clone(),
                    kind: kind.clone(),
                    reason: DropReason::Malformed,
                    detail: match why {
                        LineRejection::TooShort => "too short to be a request".into(),
                        LineRejection::TooLong => "longer than a request".into(),
                        LineRejection::NamesTheTool(t) => format!("names the tool `{t}`"),
                        LineRejection::LooksLikeCode => "code or JSON, not a request".into(),
                    },
                    reference: None,
                    result_start: None,
                });
            }
            for r in requests.into_iter().take(*n) {
                if prompt::EXAMPLES.iter().any(|e| parse::same_request(e, &r)) {
                    dropped.push(Dropped {
                        prompt: r,
                        owner: owner.clone(),
                        kind: kind.clone(),
                        reason: DropReason::Malformed,
                        detail: "copies the prompt's example".into(),
                        reference: None,
                        result_start: None,
                    });
                    continue;
                }
                if seen.iter().any(|s| parse::same_request(s, &r)) {
                    dropped.push(Dropped {
                        prompt: r,
                        owner: owner.clone(),
                        kind: kind.clone(),
                        reason: DropReason::Duplicate,
                        detail: "repeats a request already drafted or in the suite".into(),
                        reference: None,
                        result_start: None,
                    });
                    continue;
                }
                seen.push(r.clone());
                candidates.push(Candidate {
                    prompt: r,
                    owner: owner.clone(),
                    kind: kind.clone(),
                });
            }
            p.done += 1;
        }
        progress(p);
    }
    if !any && dropped.is_empty() {
        // Nothing at all: name what the model wrote, so the message can show it.
        dropped.push(Dropped {
            prompt: tools::cut(first_reply.as_deref().unwrap_or("").trim(), 200),
            owner: None,
            kind: Kind::NoTool,
            reason: DropReason::Malformed,
            detail: "no numbered list in the reply".into(),
            reference: None,
            result_start: None,
        });
    }
    Ok((candidates, dropped, any))
}

fn salt_of(s: &str) -> u64 {
    let d = Sha256::digest(s.as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    u64::from_le_bytes(b)
}

struct VerifyCtx<'a> {
    cfg: &'a DraftConfig,
    spec: &'a ServerSpec,
    model: &'a dyn ChatModel,
    main: &'a McpServer,
    fixture: Option<&'a Fixture>,
    tools: &'a [ToolSpec],
    access: &'a BTreeMap<String, Access>,
    observations: &'a [&'a Observation],
}

/// A candidate with its reference call run.
struct Ran {
    c: Candidate,
    call: ReferenceCall,
    result: String,
    again: String,
}

async fn verify(
    ctx: &VerifyCtx<'_>,
    candidates: Vec<Candidate>,
    stop: &AtomicBool,
    p: &mut Progress,
    progress: &mut dyn FnMut(&Progress),
) -> (Vec<Kept>, Vec<Dropped>, bool) {
    let mut kept = Vec::new();
    let mut dropped = Vec::new();
    let mut stopped = false;
    let model_id = ctx.model.id();
    let drop = |c: &Candidate,
                reason,
                detail: String,
                call: Option<ReferenceCall>,
                result: Option<&str>| Dropped {
        prompt: c.prompt.clone(),
        owner: c.owner.clone(),
        kind: c.kind.clone(),
        reason,
        detail,
        reference: call,
        result_start: result.map(|r| cut_result(r, RESULT_IN_REVIEW)),
    };
    let by_name: BTreeMap<&str, &ToolSpec> =
        ctx.tools.iter().map(|t| (t.name.as_str(), t)).collect();
    let mut queue = candidates.into_iter();
    loop {
        let chunk: Vec<Candidate> = queue.by_ref().take(BATCH).collect();
        if chunk.is_empty() {
            break;
        }
        if stop.load(Ordering::SeqCst) {
            stopped = true;
            for c in chunk.iter().chain(queue.as_slice()) {
                dropped.push(drop(
                    c,
                    DropReason::Stopped,
                    "drafting was stopped first".into(),
                    None,
                    None,
                ));
            }
            break;
        }
        // No-tool requests have nothing to run: the check is that no tool is called.
        let (no_tool, owned): (Vec<Candidate>, Vec<Candidate>) =
            chunk.into_iter().partition(|c| c.owner.is_none());
        for c in no_tool {
            kept.push(Kept {
                id: String::new(),
                prompt: c.prompt,
                split: Split::Train,
                owner: None,
                kind: c.kind,
                check: TaskCheck::Routing("no tool serves it: not run on the server".into()),
                reference: None,
                result_start: None,
                digest: None,
                model: model_id.clone(),
            });
            p.done += 1;
        }
        // Reference calls, written together.
        let mut calls: Vec<Option<ReferenceCall>> = Vec::new();
        let reqs: Vec<ChatRequest> = owned
            .iter()
            .map(|c| {
                let owner = c.owner.as_deref().unwrap_or_default();
                let sys = prompt::render(
                    "call.jinja",
                    json!({"observations": observation_views(ctx.observations, Some(owner))}),
                )
                .unwrap_or_default();
                call_request(by_name[owner], sys, c.prompt.clone())
            })
            .collect();
        let replies = if reqs.is_empty() {
            Vec::new()
        } else {
            ctx.model.chat_many(&reqs).await
        };
        for (c, reply) in owned.iter().zip(replies) {
            let owner = c.owner.as_deref().unwrap_or_default();
            calls.push(
                reply
                    .ok()
                    .and_then(|r| r.tool_calls.into_iter().find(|k| k.name == owner))
                    .filter(|k| k.arguments.is_object())
                    .map(|k| ReferenceCall {
                        tool: k.name,
                        arguments: k.arguments,
                    }),
            );
        }
        // Run them.
        let mut ran: Vec<Ran> = Vec::new();
        for (c, call) in owned.into_iter().zip(calls) {
            let Some(call) = call else {
                dropped.push(drop(
                    &c,
                    DropReason::NoCall,
                    "the model wrote no call of the owner".into(),
                    None,
                    None,
                ));
                p.done += 1;
                continue;
            };
            match run_twice(ctx, &call).await {
                Ok((result, again)) => ran.push(Ran {
                    c,
                    call,
                    result,
                    again,
                }),
                Err((reason, detail, result)) => {
                    dropped.push(drop(&c, reason, detail, Some(call), result.as_deref()));
                    p.done += 1;
                }
            }
        }
        // Verdicts, asked together; an unreadable one is asked once more with a reminder.
        let verdicts = verdicts(ctx, &ran).await;
        for (r, v) in ran.into_iter().zip(verdicts) {
            p.done += 1;
            let digest = format!(
                "sha256:{}",
                hex::encode(Sha256::digest(r.result.as_bytes()))
            );
            let v = match v {
                None => {
                    dropped.push(drop(
                        &r.c,
                        DropReason::UnreadableVerdict,
                        "the model's verdict on the result could not be read".into(),
                        Some(r.call),
                        Some(&r.result),
                    ));
                    continue;
                }
                Some(v) => v,
            };
            if !v.answers {
                dropped.push(drop(
                    &r.c,
                    DropReason::NotAnswered,
                    "the model judged that the result does not give what the request asks".into(),
                    Some(r.call),
                    Some(&r.result),
                ));
                continue;
            }
            let owner = r.c.owner.clone().unwrap_or_default();
            let check = if ctx.access[&owner].explorable() {
                match parse::answer_check(v.value.as_deref(), &r.result, &r.again) {
                    Ok(c) => TaskCheck::Answer(c),
                    Err(why) => TaskCheck::Routing(routing_reason(&why, v.value.as_deref())),
                }
            } else {
                TaskCheck::Routing("the owner may write: its result is not an answer".into())
            };
            kept.push(Kept {
                id: String::new(),
                prompt: r.c.prompt,
                split: Split::Train,
                owner: r.c.owner,
                kind: r.c.kind,
                check,
                reference: Some(r.call),
                result_start: Some(cut_result(&r.result, RESULT_IN_REVIEW)),
                digest: Some(digest),
                model: model_id.clone(),
            });
        }
        progress(p);
    }
    (kept, dropped, stopped)
}

fn routing_reason(why: &NoCheck, value: Option<&str>) -> String {
    match value {
        Some(v) => format!("{} ({:?})", why.describe(), tools::cut(v, 60)),
        None => why.describe().to_string(),
    }
}

type CallFailure = (DropReason, String, Option<String>);

/// Runs a reference call twice (on the shared server for a read-only tool, on two fresh fixture copies for one that
/// may write); the two result texts, or why the call failed.
async fn run_twice(
    ctx: &VerifyCtx<'_>,
    call: &ReferenceCall,
) -> Result<(String, String), CallFailure> {
    let access = ctx.access[&call.tool];
    if access.explorable() || ctx.fixture.is_none() {
        if access == Access::Writes && ctx.fixture.is_none() {
            return Err((
                DropReason::WritesWithoutFixture,
                format!(
                    "`{}` declares that it writes and no --fixture was given, so it was not called",
                    call.tool
                ),
                None,
            ));
        }
        let a = run_one(ctx, ctx.main, call).await?;
        let b = run_one(ctx, ctx.main, call).await?;
        return Ok((a, b));
    }
    let Some(f) = ctx.fixture else {
        return Err((DropReason::ServerFailed, "no fixture".into(), None));
    };
    let mut out = Vec::new();
    for _ in 0..2 {
        let w = Workspace::open(f, ctx.spec, None)
            .await
            .map_err(|e| (DropReason::ServerFailed, e.to_string(), None))?;
        let r = run_one(ctx, &w.server, call).await;
        w.close().await;
        out.push(r?);
    }
    let b = out.pop().unwrap_or_default();
    let a = out.pop().unwrap_or_default();
    Ok((a, b))
}

async fn run_one(
    ctx: &VerifyCtx<'_>,
    server: &McpServer,
    call: &ReferenceCall,
) -> Result<String, CallFailure> {
    match server
        .call_tool(&call.tool, call.arguments.clone(), ctx.cfg.call_timeout)
        .await
    {
        Ok(o) if o.is_error => Err((
            DropReason::ToolError,
            format!("`{}` answered with an error", call.tool),
            Some(o.content_text),
        )),
        Ok(o) if o.content_text.trim().is_empty() => Err((
            DropReason::EmptyResult,
            format!("`{}` returned nothing", call.tool),
            None,
        )),
        Ok(o) => Ok(o.content_text),
        Err(e @ EvalError::Timeout { .. }) => {
            let _ = server.ensure_connected().await;
            Err((
                DropReason::Timeout,
                format!("{e}; raise --call-timeout if the tool is slow"),
                None,
            ))
        }
        Err(e @ EvalError::ToolRejected { .. }) => Err((DropReason::Rejected, e.to_string(), None)),
        Err(e) => {
            let _ = server.ensure_connected().await;
            Err((DropReason::ServerFailed, e.to_string(), None))
        }
    }
}

async fn verdicts(ctx: &VerifyCtx<'_>, ran: &[Ran]) -> Vec<Option<parse::Verdict>> {
    if ran.is_empty() {
        return Vec::new();
    }
    let Ok(sys) = system() else {
        return ran.iter().map(|_| None).collect();
    };
    let prompts: Vec<String> = ran
        .iter()
        .map(|r| {
            prompt::render(
                "verify.jinja",
                json!({"request": r.c.prompt, "tool": r.call.tool, "arguments": r.call.arguments.to_string(),
                       "result": cut_result(&r.result, 1500)}),
            )
            .unwrap_or_default()
        })
        .collect();
    let ask = |extra: &str| -> Vec<ChatRequest> {
        prompts
            .iter()
            .map(|p| {
                let mut r =
                    ChatRequest::text(vec![sys.clone(), Message::user(format!("{p}{extra}"))]);
                r.max_tokens = 80;
                r
            })
            .collect()
    };
    let first = ctx.model.chat_many(&ask("")).await;
    let mut out: Vec<Option<parse::Verdict>> = first
        .into_iter()
        .map(|r| {
            r.ok()
                .and_then(|r| parse::verdict(r.content.as_deref().unwrap_or("")))
        })
        .collect();
    let retry: Vec<usize> = (0..out.len()).filter(|i| out[*i].is_none()).collect();
    if !retry.is_empty() {
        let reqs = ask("\n\nYour reply must start with ANSWERS: yes or ANSWERS: no.");
        let again: Vec<ChatRequest> = retry.iter().map(|i| reqs[*i].clone()).collect();
        for (i, r) in retry.iter().zip(ctx.model.chat_many(&again).await) {
            out[*i] = r
                .ok()
                .and_then(|r| parse::verdict(r.content.as_deref().unwrap_or("")));
        }
    }
    out
}

/// An id from the owner and the request's first words, unique among `used` (which it joins).
fn unique_id(k: &Kept, used: &mut BTreeSet<String>) -> String {
    let prefix = match (&k.owner, &k.kind) {
        (None, _) => "no-tool".to_string(),
        (Some(o), Kind::Confusable { against }) => format!("{o}-not-{against}"),
        (Some(o), _) => o.clone(),
    };
    let words: Vec<String> = parse::normalise(&k.prompt)
        .split(' ')
        .filter(|w| {
            w.len() > 2
                && ![
                    "the", "and", "what", "for", "are", "can", "you", "how", "please", "with",
                ]
                .contains(w)
        })
        .take(4)
        .map(str::to_string)
        .collect();
    let base: String = format!("{prefix}-{}", words.join("-"))
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let base = base.trim_end_matches('-').to_string();
    let mut id = base.clone();
    let mut n = 2;
    while used.contains(&id) {
        id = format!("{base}-{n}");
        n += 1;
    }
    used.insert(id.clone());
    id
}

fn suite_text(
    cfg: &DraftConfig,
    o: &DraftOutcome,
    tool_names: &[String],
    protocol: Option<&str>,
    fixture: Option<&Fixture>,
) -> Result<String, DraftError> {
    let mut text = if cfg.more {
        let mut t = std::fs::read_to_string(&cfg.out).map_err(|e| DraftError::Write {
            path: cfg.out.clone(),
            message: e.to_string(),
        })?;
        if !t.ends_with('\n') {
            t.push('\n');
        }
        t.push_str(&format!(
            "\n# ---- {} more tasks drafted by `tooltune suite draft --more` with {} ----\n",
            o.kept.len(),
            o.model
        ));
        t
    } else {
        let suite_dir = cfg
            .out
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        std::fs::create_dir_all(&suite_dir).map_err(|e| DraftError::Write {
            path: suite_dir.clone(),
            message: e.to_string(),
        })?;
        let bin = tooltune_evaluator::suite::bin_dir();
        let third = tooltune_evaluator::suite::third_party_dir(&suite_dir);
        let port = |w: &str| write::portable(w, &suite_dir, &bin, &third);
        let (command, args, url) = match &cfg.server.transport {
            Transport::Stdio { command, args, .. } => (
                Some(port(command.as_str())),
                args.iter().map(|a| port(a.as_str())).collect::<Vec<_>>(),
                None,
            ),
            Transport::Http { url, .. } => (None, Vec::new(), Some(url.clone())),
            // Drafting explores a running server; a catalog never reaches here (refused at start).
            Transport::Catalog { .. } => (None, Vec::new(), None),
        };
        let fixture_path = fixture.map(|f| {
            suite_dir
                .canonicalize()
                .map(|base| write::relative(&f.source, &base).display().to_string())
                .unwrap_or_else(|_| f.source.display().to_string())
        });
        let name = cfg.name.clone().unwrap_or_else(|| file_stem(&cfg.out));
        let review = o
            .review_md
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        write::header(&write::Header {
            name: &name,
            description: &format!(
                "Drafted by tooltune suite draft with {} ({} tasks kept of {} drafted).",
                o.model,
                o.kept.len(),
                o.drafted()
            ),
            tools: tool_names,
            fixture: fixture_path.as_deref(),
            command: command.as_deref().map(|c| (c, args.as_slice())),
            url: url.as_deref(),
            protocol,
            review: &review,
        })
    };
    for k in &o.kept {
        text.push_str(&write::task(k, tool_names));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(owner: Option<&str>, prompt: &str) -> Kept {
        Kept {
            id: String::new(),
            prompt: prompt.into(),
            split: Split::Train,
            owner: owner.map(str::to_string),
            kind: Kind::Tool,
            check: TaskCheck::Routing("x".into()),
            reference: None,
            result_start: None,
            digest: None,
            model: "fake".into(),
        }
    }

    #[test]
    fn ids_come_from_owner_and_words_and_are_unique() {
        let mut used = BTreeSet::from(["read_file-notes-txt-file".to_string()]);
        let a = unique_id(
            &kept(Some("read_file"), "What's in the notes.txt file?"),
            &mut used,
        );
        assert_eq!(a, "read_file-notes-txt-file-2");
        let b = unique_id(&kept(None, "Tell me a joke about cats"), &mut used);
        assert_eq!(b, "no-tool-tell-joke-about-cats");
        assert!(!b.contains(char::is_whitespace));
    }

    #[test]
    fn arguments_read_as_pairs() {
        assert_eq!(
            plain_arguments(&json!({"path": "notes.txt", "n": 2})),
            "path: notes.txt, n: 2"
        );
        assert_eq!(plain_arguments(&json!({})), "");
    }

    #[test]
    fn default_arguments_fill_required_parameters_by_type() {
        let s = json!({"type": "object", "properties": {"path": {"type": "string"}, "n": {"type": "integer"},
            "opt": {"type": "string"}}, "required": ["path", "n"]});
        assert_eq!(default_arguments(&s), json!({"path": "", "n": 1}));
    }
}

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
//! Ctrl-C (the stop flag) ends the current batch; what was verified by then is written. Starting the server and
//! running reference calls are in `server.rs`, the last stage (ids, splits, the file, the review pages) in
//! `finish.rs`, both shared with `suite from-traces`.

use crate::DraftError;
use crate::finish::{self, SuiteFile};
use crate::parse::{self, LineRejection, NoCheck};
use crate::prompt::{self, ObservationView, ToolView};
use crate::server::{self, Calls};
use crate::tools;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use tooltune_core::ToolSpec;
use tooltune_evaluator::{McpServer, ReferenceCall, Split, Suite};
use tooltune_llm::{ChatModel, ChatRequest, Message, ToolChoice};

pub use crate::outcome::{
    Counts, DraftConfig, DraftOutcome, DropReason, Dropped, Kept, Kind, Observation, Origin,
    Progress, TaskCheck, TraceSummary,
};
pub use crate::server::command_line;

/// How much of a result the prompts show, in characters.
const RESULT_IN_PROMPT: usize = 500;
/// How much of a result the review page shows.
pub(crate) const RESULT_IN_REVIEW: usize = 240;
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
    // The server exploration and read-only reference calls run on: the live server, or one fixture copy.
    let opened = server::open(&cfg.server, cfg.fixture.as_deref()).await?;
    let server::Opened {
        spec,
        fixture,
        main,
        tools: all_tools,
        access,
        protocol,
    } = opened;
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
        calls: Calls {
            spec: &spec,
            main: main.server(),
            fixture: fixture.as_ref(),
            access: &access,
            timeout: cfg.call_timeout,
        },
        model,
        tools: &all_tools,
        observations: &observations,
    };
    let (verified, more_dropped, stopped) = verify(&ctx, candidates, stop, &mut p, progress).await;
    dropped.extend(more_dropped);
    main.close().await;

    let kept = finish::ids_and_splits(verified, existing.as_ref(), cfg.seed);

    // 4. Write.
    p.stage = "writing";
    progress(&p);
    let (review_md, review_html) = finish::review_paths(&cfg.out);
    let mut outcome = DraftOutcome {
        suite: None,
        review_md: review_md.clone(),
        review_html,
        model: model.id(),
        tools: tool_names.iter().map(|n| (n.clone(), access[n])).collect(),
        explored,
        existing: existing.as_ref().map_or(0, |s| s.tasks.len()),
        kept,
        dropped,
        earlier: existing.as_ref().map(finish::earlier).unwrap_or_default(),
        traces: None,
        stopped,
        seconds: 0.0,
    };
    outcome.seconds = started.elapsed().as_secs_f64();
    let file = SuiteFile {
        out: &cfg.out,
        name: cfg.name.as_deref(),
        server: Some(&cfg.server),
        fixture: fixture.as_ref(),
        protocol: protocol.as_deref(),
        tools: &tool_names,
        existing: existing.as_ref(),
        opening: OPENING,
        description: format!(
            "Drafted by tooltune suite draft with {} ({} tasks kept of {} drafted).",
            outcome.model,
            outcome.kept.len(),
            outcome.drafted()
        ),
        appended: format!(
            "{} more tasks drafted by `tooltune suite draft --more` with {}",
            outcome.kept.len(),
            outcome.model
        ),
    };
    finish::write_files(&file, &mut outcome)?;
    if outcome.kept.is_empty() {
        return Err(outcome.nothing_kept(review_md));
    }
    Ok(outcome)
}

/// The opening comment of a drafted suite (`{review}`: the review page's file name).
const OPENING: &str = "Drafted by `tooltune suite draft` from the server alone: requests a model wrote after exploring the
server, each verified there with a reference call. Read {review} before using it; edit or delete tasks freely
(provenance is informational). `tooltune suite check` re-runs the reference calls. Format:
docs/suite-format.md.";

pub(crate) fn cut_result(text: &str, max: usize) -> String {
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
                    reference: Vec::new(),
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
                        reference: Vec::new(),
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
                        reference: Vec::new(),
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
            reference: Vec::new(),
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
    calls: Calls<'a>,
    model: &'a dyn ChatModel,
    tools: &'a [ToolSpec],
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
        reference: call.into_iter().collect(),
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
                reference: Vec::new(),
                result_start: None,
                digest: None,
                origin: Origin::Drafted {
                    model: model_id.clone(),
                },
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
            match ctx.calls.run_twice(&call).await {
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
            let check = if ctx.calls.access[&owner].explorable() {
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
                reference: vec![r.call],
                result_start: Some(cut_result(&r.result, RESULT_IN_REVIEW)),
                digest: Some(digest),
                origin: Origin::Drafted {
                    model: model_id.clone(),
                },
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
#[cfg(test)]
mod tests {
    use super::*;

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

//! Evaluating one candidate (a set of description overrides) on a suite: full rollouts against the real server,
//! scored by the suite's checks, and, when the backend can score exactly, the probability that the first call picks
//! each tool. Every rollout is stored as a trajectory linked to its run and candidate.

use crate::EvalError;
use crate::fixture::{self, Prepared, Workspace, check_world};
use crate::host::{HostConfig, InfraFailure, Rollout, RolloutTask, ToolServer, run_rollouts};
use crate::mcp::{CallOutcome, McpServer, ToolHints};
use crate::suite::{Split, Suite, Task};
use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tooltune_core::{Links, Outcome, ToolSpec, TrajectorySink};
use tooltune_llm::{ChatModel, ChatRequest, Message};
use tooltune_objectives::stats::Rate;

/// A candidate: the descriptions it puts in front of the model, by tool name. Tools it does not name keep the
/// server's own description.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Candidate {
    /// Tool name -> description the model sees.
    pub descriptions: BTreeMap<String, String>,
}

impl Candidate {
    /// The tool list with this candidate's descriptions applied. Unknown tool names are an error naming them, so a
    /// typo in `--override` does not silently evaluate the seed.
    pub fn apply(&self, tools: &[ToolSpec]) -> Result<Vec<ToolSpec>, EvalError> {
        for name in self.descriptions.keys() {
            if !tools.iter().any(|t| &t.name == name) {
                return Err(EvalError::UnknownTool {
                    tool: name.clone(),
                    available: tools
                        .iter()
                        .map(|t| t.name.clone())
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
        }
        Ok(tools
            .iter()
            .map(|t| match self.descriptions.get(&t.name) {
                Some(d) => ToolSpec {
                    description: d.clone(),
                    ..t.clone()
                },
                None => t.clone(),
            })
            .collect())
    }
}

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Full rollouts (tool calls on the real server, results back to the model, final answer checked), plus exact
    /// first-call probabilities when the backend can score.
    Full,
    /// Only the first call: exact probabilities (or one sampled first turn when the backend cannot score).
    /// Measures selection, not success.
    SelectionOnly,
}

/// How to evaluate.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    /// Only tasks of this split (all tasks when `None`).
    pub split: Option<Split>,
    /// Only these task ids (all when empty).
    pub task_ids: Vec<String>,
    /// The tool under study, for selection figures (default: the suite's first tool under study).
    pub target: Option<String>,
    /// What to measure.
    pub mode: Mode,
    /// The host's settings.
    pub host: HostConfig,
    /// Timeout of one tool call.
    pub call_timeout: Duration,
    /// How many rollouts advance together (one batch for the model).
    pub batch: usize,
    /// Links written into every stored trajectory.
    pub run_id: Option<String>,
    /// Candidate id written into every stored trajectory.
    pub candidate_id: Option<String>,
    /// Rollout index written into every stored trajectory (several rollouts per task when sampling).
    pub rollout: u32,
    /// Selection-only evaluation on a backend that cannot score first moves exactly (a hosted one): how many
    /// first turns are sampled per task (at temperature 1) to estimate the first-move distribution. 1 keeps the
    /// host's own sampling and gives each move probability 0 or 1.
    pub first_move_samples: u32,
}

impl Default for EvalOptions {
    fn default() -> Self {
        EvalOptions {
            split: None,
            task_ids: Vec::new(),
            target: None,
            mode: Mode::Full,
            host: HostConfig::default(),
            call_timeout: Duration::from_secs(30),
            batch: 8,
            run_id: None,
            candidate_id: None,
            rollout: 0,
            first_move_samples: DEFAULT_FIRST_MOVE_SAMPLES,
        }
    }
}

/// Sampled first turns per task when the backend cannot score exactly. Eight keeps a screen of 40 tasks at 320
/// short completions (first turn only, a few dozen tokens each); a task's routing probability is then known to
/// within about ±0.3 (95%), and a suite's mean to within about ±0.05.
pub const DEFAULT_FIRST_MOVE_SAMPLES: u32 = 8;

/// The outcome of one task.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct TaskResult {
    /// The task id.
    pub task_id: String,
    /// The tool the task belongs to.
    pub owner: Option<String>,
    /// Whether the checks passed (false for selection-only evaluations and infrastructure failures).
    pub success: bool,
    /// The checks' score in [0, 1].
    pub score: f64,
    /// The checks' feedback.
    pub feedback: String,
    /// The final answer.
    pub final_answer: Option<String>,
    /// Tools called, in order (for selection-only: the sampled first call, if any).
    pub called: Vec<String>,
    /// Whether the target tool was the first call.
    pub target_first: bool,
    /// Whether the target tool was called at all.
    pub target_called: bool,
    /// Exact probability that the agent's first move is a call of each tool, when the backend scores exactly.
    /// With `no_call_probability` they sum to 1.
    pub first_call_probabilities: Option<BTreeMap<String, f64>>,
    /// Exact probability that the agent answers without calling a tool first.
    #[serde(default)]
    pub no_call_probability: Option<f64>,
    /// Exact probability that the first move is the right one: the owner tool, or no tool for a task without
    /// an owner (the routing measure).
    #[serde(default)]
    pub routing_probability: Option<f64>,
    /// Set when the server or model backend failed: the task says nothing about the candidate.
    pub infra_failure: Option<String>,
    /// The stored trajectory's id (full mode).
    pub trajectory_id: Option<String>,
    /// When the first-move probabilities are estimated, not exact: the sampled first turns they count (a
    /// backend that cannot score exactly). `None`: exact, or none.
    #[serde(default)]
    pub first_move_samples: Option<u32>,
    /// Tools the rollout called that are not declared read-only (`readOnlyHint`), in call order without
    /// repeats: calls that may have changed the server's state.
    #[serde(default)]
    pub side_effect_calls: Vec<String>,
    /// With a fixture: whether the rollout changed its copy (its digest after the rollout differs from the
    /// fixture's). `None` without a fixture.
    #[serde(default)]
    pub changed_fixture: Option<bool>,
    /// Tools that declared `readOnlyHint: true` although the rollout, which called only such tools, changed the
    /// fixture: the hint is false.
    #[serde(default)]
    pub read_only_violations: Vec<String>,
}

impl TaskResult {
    /// The result of a task that could not be played (its server would not start, its worker was lost each time
    /// it took it): an infrastructure failure, which says nothing about the candidate.
    pub fn infrastructure_failure(task_id: &str, owner: Option<String>, message: String) -> Self {
        TaskResult {
            task_id: task_id.to_string(),
            owner,
            success: false,
            score: 0.0,
            feedback: String::new(),
            final_answer: None,
            called: Vec::new(),
            target_first: false,
            target_called: false,
            first_call_probabilities: None,
            no_call_probability: None,
            routing_probability: None,
            infra_failure: Some(message),
            trajectory_id: None,
            first_move_samples: None,
            side_effect_calls: Vec::new(),
            changed_fixture: None,
            read_only_violations: Vec::new(),
        }
    }
}

/// Where the time went.
#[derive(Debug, Clone, Copy, Default, Serialize, serde::Deserialize)]
pub struct Timings {
    /// Wall time of the whole evaluation, seconds.
    pub total_s: f64,
    /// Time inside model calls (generation and scoring), seconds.
    pub model_s: f64,
    /// Time inside tool calls on the server, seconds.
    pub tools_s: f64,
    /// Time writing to the store, seconds.
    pub store_s: f64,
}

impl Timings {
    /// Share of wall time spent outside the model.
    pub fn outside_model_share(&self) -> f64 {
        if self.total_s > 0.0 {
            ((self.total_s - self.model_s) / self.total_s).max(0.0)
        } else {
            0.0
        }
    }
}

/// A candidate's results on a suite.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct SuiteResult {
    /// The suite name.
    pub suite: String,
    /// The tool under study.
    pub target: String,
    /// What was measured.
    pub mode: Mode,
    /// Per task.
    pub tasks: Vec<TaskResult>,
    /// Task success over tasks without infrastructure failure (full mode).
    pub success_rate: Rate,
    /// How often the target was the first call, over all judged tasks.
    pub selection_rate: Rate,
    /// How often the target was first on tasks owned by another tool.
    pub off_target_selection: Rate,
    /// Mean exact probability that the first call picks the target, when the backend scores exactly.
    pub expected_selection: Option<f64>,
    /// Share of judged tasks whose played first move was the right one (owner first, no tool where none is
    /// needed).
    pub routing: Rate,
    /// Mean exact probability of the right first move, when the backend scores exactly; the mean of sampled
    /// estimates when it cannot (then `first_move_samples` says how many per task).
    pub expected_routing: Option<f64>,
    /// With sampled first moves: the samples per task, and a 95% interval of `expected_routing` (Wilson, over
    /// every sampled first move of every task).
    #[serde(default)]
    pub first_move_samples: Option<u32>,
    /// See `first_move_samples`.
    #[serde(default)]
    pub expected_routing_interval: Option<(f64, f64)>,
    /// Tasks whose rollout hit an infrastructure failure.
    pub infra_failures: u64,
    /// Where the time went.
    pub timings: Timings,
    /// Whether every rollout ran on a fresh copy of the suite's fixture.
    #[serde(default)]
    pub fixture: bool,
    /// Tools called in some rollout that are not declared read-only. Without a fixture (or a reset command) such
    /// calls may have changed the state later rollouts saw, so results may depend on the order tasks ran in.
    #[serde(default)]
    pub side_effect_tools: Vec<String>,
    /// Tools caught writing although they declare `readOnlyHint: true` (see [`TaskResult::read_only_violations`]).
    #[serde(default)]
    pub read_only_violations: Vec<String>,
    /// The rollouts' trajectories, when `evaluate` was given no store to write them to (a worker hands them to
    /// the driver with each result instead). Not part of the result's JSON.
    #[serde(skip)]
    pub trajectories: Vec<tooltune_core::Trajectory>,
}

impl SuiteResult {
    /// The warning a user should see when rollouts may have run against a changing world: tools that may write
    /// were called and nothing reset the state between rollouts. `None` when the world stayed fixed.
    pub fn order_warning(&self) -> Option<String> {
        if self.fixture || self.side_effect_tools.is_empty() {
            return None;
        }
        Some(format!(
            "rollouts called {} (not declared read-only) on one server that is not reset between rollouts: later \
             rollouts may have seen what earlier ones wrote, so results may depend on task order. Give the suite a \
             [fixture] (or a [reset] command) to start every rollout from the same state.",
            self.side_effect_tools
                .iter()
                .map(|t| format!("`{t}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }
}

/// Adapts the MCP client to the host: a tool's JSON-RPC rejection goes back to the model as a failed result; a
/// dead server or a timeout is an infrastructure failure.
struct McpTools<'a> {
    server: &'a McpServer,
    timeout: Duration,
}

#[async_trait]
impl ToolServer for McpTools<'_> {
    async fn call(&self, name: &str, arguments: &Value) -> Result<CallOutcome, InfraFailure> {
        match self
            .server
            .call_tool(name, arguments.clone(), self.timeout)
            .await
        {
            Ok(out) => Ok(out),
            Err(e) if !e.is_infrastructure() => Ok(CallOutcome {
                content_text: format!("error: {e}"),
                is_error: true,
                duration: Duration::ZERO,
            }),
            Err(e) => Err(InfraFailure {
                message: e.to_string(),
            }),
        }
    }
}

/// Evaluates `candidate` on `suite` with `server` already connected (kept alive by the caller across candidates).
/// Trajectories go to `sink` (the trace store) chunk by chunk as they finish, so a crash loses at most the chunk in
/// flight; with no sink they are kept in the result.
pub async fn evaluate(
    suite: &Suite,
    server: &McpServer,
    model: &dyn ChatModel,
    sink: Option<&dyn TrajectorySink>,
    candidate: &Candidate,
    opts: &EvalOptions,
    mut progress: impl FnMut(usize, usize) + Send,
) -> Result<SuiteResult, EvalError> {
    let started = Instant::now();
    // Names are checked against everything the server offers (a hidden tool must exist too), then hidden.
    let listed = server.list_tools().await?;
    suite.check_tool_names(&listed)?;
    let server_tools = suite.visible_tools(listed);
    let hints = server.hints();
    // The suite may measure descriptions under its own host's system prompt.
    let mut host = opts.host.clone();
    if let Some(p) = &suite.system_prompt {
        host.system_prompt = p.clone();
    }
    let host = &host;
    let tools = candidate.apply(&server_tools)?;
    let target = opts
        .target
        .clone()
        .or_else(|| suite.tools_under_study.first().cloned())
        .ok_or_else(|| EvalError::NoTarget {
            suite: suite.name.clone(),
        })?;
    let tasks: Vec<&Task> = suite
        .tasks
        .iter()
        .filter(|t| opts.split.is_none_or(|s| t.split == s))
        .filter(|t| opts.task_ids.is_empty() || opts.task_ids.contains(&t.id))
        .collect();
    let names: Vec<String> = tools.iter().map(|t| t.name.clone()).collect();
    let mut timings = Timings::default();
    let mut results: Vec<TaskResult> = Vec::with_capacity(tasks.len());
    let mut done = 0;
    progress(0, tasks.len());
    // A reset command cannot give rollouts that run together a state each: they run one at a time.
    let batch = if suite.reset.is_some() {
        1
    } else {
        opts.batch.max(1)
    };
    let chunks: Vec<&[&Task]> = tasks.chunks(batch).collect();
    let fixture = suite.fixture.as_ref().filter(|_| opts.mode == Mode::Full);
    // Workspaces (fixture copies with started servers) for the next chunk, prepared while this one runs.
    let mut prepared = fixture.map(|f| Prepared::start(f, &suite.server, 0, chunks[0].len()));
    let mut closing = Vec::new();
    let mut kept = Vec::new();
    for (c, chunk) in chunks.iter().enumerate() {
        let chunk: &[&Task] = chunk;
        // Exact first-call probabilities (one shared prefill per chunk on the local backend).
        let first_requests: Vec<ChatRequest> = chunk
            .iter()
            .map(|t| first_turn_request(host, &tools, &t.prompt))
            .collect();
        let t0 = Instant::now();
        let scored = model.score_first_moves(&first_requests, &names).await;
        timings.model_s += t0.elapsed().as_secs_f64();
        let moves: Vec<Option<FirstMoves>> = scored
            .into_iter()
            .zip(chunk)
            .map(|(r, task)| {
                r.ok()
                    .flatten()
                    .map(|m| FirstMoves::new(&names, &m, task.owner.as_deref()))
            })
            .collect();
        let probabilities: Vec<Option<BTreeMap<String, f64>>> = moves
            .iter()
            .map(|m| m.as_ref().map(|m| m.tools.clone()))
            .collect();

        match opts.mode {
            Mode::SelectionOnly => {
                let need: Vec<usize> = (0..chunk.len())
                    .filter(|&i| probabilities[i].is_none())
                    .collect();
                let n = opts.first_move_samples.max(1);
                let mut sampled: BTreeMap<usize, Result<(FirstMoves, u32), String>> =
                    BTreeMap::new();
                if !need.is_empty() {
                    let mut reqs = Vec::with_capacity(need.len() * n as usize);
                    for &i in &need {
                        for k in 0..n {
                            let mut r = first_requests[i].clone();
                            if n > 1 {
                                // Independent draws of the same first turn: the host's own setting is greedy.
                                r.temperature = 1.0;
                                r.seed = Some(host.seed.unwrap_or(0).wrapping_add(u64::from(k)));
                            }
                            reqs.push(r);
                        }
                    }
                    let t0 = Instant::now();
                    let replies = model.chat_many(&reqs).await;
                    timings.model_s += t0.elapsed().as_secs_f64();
                    for (j, &i) in need.iter().enumerate() {
                        let draws = &replies[j * n as usize..(j + 1) * n as usize];
                        let firsts: Vec<Option<String>> = draws
                            .iter()
                            .filter_map(|r| r.as_ref().ok())
                            .map(|r| r.tool_calls.first().map(|c| c.name.clone()))
                            .collect();
                        let r = match estimate_first_move(&names, &firsts) {
                            Some(m) => Ok((
                                FirstMoves::new(&names, &m, chunk[i].owner.as_deref()),
                                firsts.len() as u32,
                            )),
                            None => Err(draws.iter().find_map(|r| r.as_ref().err()).map_or_else(
                                || "no first move sampled".to_string(),
                                |e| format!("model backend: {e}"),
                            )),
                        };
                        sampled.insert(i, r);
                    }
                }
                for (i, task) in chunk.iter().enumerate() {
                    let (m, samples, infra) = match (moves[i].as_ref(), sampled.remove(&i)) {
                        (Some(m), _) => (Some(m.clone()), None, None),
                        (None, Some(Ok((m, k)))) => (Some(m), Some(k), None),
                        (None, Some(Err(e))) => (None, None, Some(e)),
                        (None, None) => (None, None, Some("no selection measured".to_string())),
                    };
                    // The most likely first move (answering without a tool included): the mode of the samples
                    // when they were sampled.
                    let first = m
                        .as_ref()
                        .and_then(|m| likeliest_first(&m.tools, Some(m.no_call)));
                    results.push(TaskResult {
                        task_id: task.id.clone(),
                        owner: task.owner.clone(),
                        success: false,
                        score: 0.0,
                        feedback: String::new(),
                        final_answer: None,
                        target_first: first.as_deref() == Some(target.as_str()),
                        target_called: first.as_deref() == Some(target.as_str()),
                        called: first.into_iter().collect(),
                        first_call_probabilities: m.as_ref().map(|m| m.tools.clone()),
                        no_call_probability: m.as_ref().map(|m| m.no_call),
                        routing_probability: m.as_ref().map(|m| m.routed),
                        infra_failure: infra,
                        trajectory_id: None,
                        first_move_samples: samples,
                        side_effect_calls: Vec::new(),
                        changed_fixture: None,
                        read_only_violations: Vec::new(),
                    });
                }
            }
            Mode::Full => {
                let rollout_tasks: Vec<RolloutTask> = chunk
                    .iter()
                    .map(|t| RolloutTask {
                        prompt: t.prompt.clone(),
                        max_steps: t.max_steps,
                    })
                    .collect();
                // The chunk's worlds: with a fixture, a fresh copy and server per rollout (prepared ahead);
                // the next chunk's start preparing now, behind this chunk's model work.
                let workspaces: Vec<Result<Workspace, EvalError>> = match prepared.take() {
                    Some(p) => p.take().await,
                    None => Vec::new(),
                };
                if let (Some(f), Some(next)) = (fixture, chunks.get(c + 1)) {
                    prepared = Some(Prepared::start(
                        f,
                        &suite.server,
                        (c + 1) * batch,
                        next.len(),
                    ));
                }
                if let Some(r) = &suite.reset {
                    r.run(&suite.dir).await?;
                }
                let adapters: Vec<Box<dyn ToolServer + '_>> = if fixture.is_none() {
                    vec![Box::new(McpTools {
                        server,
                        timeout: opts.call_timeout,
                    })]
                } else {
                    workspaces
                        .iter()
                        .map(|w| -> Box<dyn ToolServer + '_> {
                            match w {
                                Ok(w) => Box::new(McpTools {
                                    server: &w.server,
                                    timeout: opts.call_timeout,
                                }),
                                Err(e) => Box::new(Unavailable(e.to_string())),
                            }
                        })
                        .collect()
                };
                let refs: Vec<&dyn ToolServer> = adapters.iter().map(|a| a.as_ref()).collect();
                let rollouts = run_rollouts(model, &refs, &tools, &rollout_tasks, host).await;
                drop(refs);
                drop(adapters);
                // What each rollout did to its world: checks on the copy, and whether it changed at all.
                let mut worlds: Vec<(WorldChecks, Option<bool>)> = Vec::new();
                if let Some(f) = fixture {
                    for (task, w) in chunk.iter().zip(&workspaces) {
                        worlds.push(match w {
                            Ok(w) => (
                                check_world(task, w.dir()).await,
                                fixture::digest(w.dir()).ok().map(|d| d != f.digest),
                            ),
                            Err(_) => (Vec::new(), None),
                        });
                    }
                    // Closing (stopping the servers, removing the copies) runs in the background.
                    for w in workspaces.into_iter().flatten() {
                        closing.push(tokio::spawn(w.close()));
                    }
                }
                let tool_s: f64 = rollouts.iter().map(|r| r.tool_time.as_secs_f64()).sum();
                timings.tools_s += tool_s;
                timings.model_s += rollouts
                    .iter()
                    .map(|r| r.model_time.as_secs_f64())
                    .fold(0.0, f64::max);
                if rollouts.iter().any(|r| r.infra_failure.is_some()) && !server.is_alive().await {
                    // The next chunk needs a live server; the failed rollouts stay marked as infrastructure errors.
                    // A failed restart is not this chunk's error: the next chunk's calls then fail as
                    // infrastructure errors and the restart is tried again after it, so it is logged, not returned.
                    if let Err(e) = server.restart().await {
                        tracing::warn!("restarting the MCP server after it died: {e}");
                    }
                }
                let mut to_store = Vec::with_capacity(rollouts.len());
                let mut worlds = worlds.into_iter();
                for ((task, rollout), m) in chunk.iter().zip(rollouts).zip(moves) {
                    let (world, changed) = worlds.next().unwrap_or_default();
                    let (result, trajectory) = judge(
                        task,
                        rollout,
                        m,
                        &target,
                        opts,
                        &World {
                            checks: &world,
                            changed,
                            hints: &hints,
                        },
                    );
                    results.push(result);
                    to_store.push(trajectory);
                }
                if let Some(sink) = sink {
                    let t0 = Instant::now();
                    sink.write(&to_store)
                        .await
                        .map_err(|e| EvalError::Store(e.to_string()))?;
                    timings.store_s += t0.elapsed().as_secs_f64();
                } else {
                    kept.extend(to_store);
                }
            }
        }
        done += chunk.len();
        progress(done, tasks.len());
    }
    for h in closing {
        let _ = h.await;
    }
    timings.total_s = started.elapsed().as_secs_f64();
    let mut result = summarise(
        suite,
        target,
        opts.mode,
        results,
        timings,
        fixture.is_some() || suite.reset.is_some(),
    );
    result.trajectories = kept;
    Ok(result)
}

fn first_turn_request(host: &HostConfig, tools: &[ToolSpec], prompt: &str) -> ChatRequest {
    ChatRequest {
        messages: vec![
            Message::system(host.system_prompt.clone()),
            Message::user(prompt.to_string()),
        ],
        tools: tools.to_vec(),
        tool_choice: tooltune_llm::ToolChoice::Auto,
        max_tokens: host.max_tokens,
        temperature: host.temperature,
        seed: host.seed,
    }
}

/// The first-move distribution estimated from sampled first turns (`Some(name)`: a call of that tool; `None`: an
/// answer without a tool). A call of a name the request did not offer counts as a call of none of
/// the candidates, so the probabilities of the candidates and of not calling may sum to less than 1. `None`
/// when nothing was sampled.
pub fn estimate_first_move(
    names: &[String],
    firsts: &[Option<String>],
) -> Option<tooltune_llm::FirstMove> {
    if firsts.is_empty() {
        return None;
    }
    let total = firsts.len() as f64;
    let calls = firsts.iter().filter(|f| f.is_some()).count() as f64;
    let given_call = names
        .iter()
        .map(|n| {
            let k = firsts
                .iter()
                .filter(|f| f.as_deref() == Some(n.as_str()))
                .count() as f64;
            if calls > 0.0 { k / calls } else { 0.0 }
        })
        .collect();
    Some(tooltune_llm::FirstMove {
        given_call,
        p_call: calls / total,
    })
}

/// A task's exact (or estimated) first moves, by name.
#[derive(Debug, Clone)]
struct FirstMoves {
    /// P(first move = a call of this tool).
    tools: BTreeMap<String, f64>,
    /// P(an answer without a tool first).
    no_call: f64,
    /// P(the right first move).
    routed: f64,
}

impl FirstMoves {
    fn new(names: &[String], m: &tooltune_llm::FirstMove, owner: Option<&str>) -> Self {
        let tools: BTreeMap<String, f64> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), m.p_tool(i).clamp(0.0, 1.0)))
            .collect();
        let no_call = m.p_no_call().clamp(0.0, 1.0);
        let routed = match owner {
            Some(o) => tools.get(o).copied().unwrap_or(0.0),
            None => no_call,
        };
        FirstMoves {
            tools,
            no_call,
            routed,
        }
    }
}

/// The most likely first move under exact probabilities: a tool, or `None` when answering without one is at
/// least as likely as every call.
fn likeliest_first(p: &BTreeMap<String, f64>, no_call: Option<f64>) -> Option<String> {
    argmax(p).filter(|t| no_call.is_none_or(|n| p[t] >= n))
}

impl TaskResult {
    /// The first-move part of a full rollout's result, as a selection-only evaluation would have given it (the
    /// most likely first move as the call, no verdict), when it carries exact probabilities: the scoring that
    /// precedes every rollout is then a screen that need not be made again.
    pub fn first_move_only(&self, target: &str) -> Option<TaskResult> {
        let p = self.first_call_probabilities.as_ref()?;
        self.routing_probability?;
        let first = likeliest_first(p, self.no_call_probability);
        Some(TaskResult {
            task_id: self.task_id.clone(),
            owner: self.owner.clone(),
            success: false,
            score: 0.0,
            feedback: String::new(),
            final_answer: None,
            target_first: first.as_deref() == Some(target),
            target_called: first.as_deref() == Some(target),
            called: first.into_iter().collect(),
            first_call_probabilities: Some(p.clone()),
            no_call_probability: self.no_call_probability,
            routing_probability: self.routing_probability,
            infra_failure: None,
            trajectory_id: None,
            first_move_samples: self.first_move_samples,
            side_effect_calls: Vec::new(),
            changed_fixture: None,
            read_only_violations: Vec::new(),
        })
    }
}

fn argmax(p: &BTreeMap<String, f64>) -> Option<String> {
    p.iter()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(k, _)| k.clone())
}

/// Verdicts of a task's checks on its fixture copy: passed, and what was found.
type WorldChecks = Vec<(bool, String)>;

/// What a rollout did to its world, for [`judge`].
struct World<'a> {
    /// Verdicts of the task's checks on the fixture copy.
    checks: &'a [(bool, String)],
    /// Whether the copy changed (`None`: no fixture).
    changed: Option<bool>,
    /// The tools' behaviour hints.
    hints: &'a BTreeMap<String, ToolHints>,
}

/// A server that could not be prepared: every call is an infrastructure failure naming why.
struct Unavailable(String);

#[async_trait]
impl ToolServer for Unavailable {
    async fn call(&self, _name: &str, _arguments: &Value) -> Result<CallOutcome, InfraFailure> {
        Err(InfraFailure {
            message: format!(
                "the rollout's server on its fixture copy did not start: {}",
                self.0
            ),
        })
    }
}

fn judge(
    task: &Task,
    rollout: Rollout,
    moves: Option<FirstMoves>,
    target: &str,
    opts: &EvalOptions,
    world: &World<'_>,
) -> (TaskResult, tooltune_core::Trajectory) {
    let mut trajectory = rollout.trajectory;
    let infra = rollout.infra_failure.map(|f| f.message);
    let check = task.check_with_world(
        trajectory.final_answer.as_deref(),
        &rollout.called,
        world.checks,
    );
    let mut side_effect_calls: Vec<String> = Vec::new();
    for c in &rollout.called {
        let may_write = world.hints.get(c).is_none_or(ToolHints::may_write);
        if may_write && !side_effect_calls.contains(c) {
            side_effect_calls.push(c.clone());
        }
    }
    // The fixture changed although every tool called claims to be read-only: those claims are false.
    let read_only_violations: Vec<String> =
        if world.changed == Some(true) && side_effect_calls.is_empty() {
            let mut v: Vec<String> = rollout.called.clone();
            v.sort();
            v.dedup();
            v
        } else {
            Vec::new()
        };
    let (success, score, feedback) = match &infra {
        Some(m) => (
            false,
            0.0,
            format!("infrastructure failure, not judged: {m}"),
        ),
        None => (check.success, check.score, check.feedback),
    };
    trajectory.outcome = Outcome {
        score: Some(score),
        success: infra.is_none().then_some(success),
        feedback: Some(feedback.clone()),
    };
    trajectory.meta.external_id = Some(task.id.clone());
    trajectory.links = Links {
        run_id: opts.run_id.clone(),
        candidate_id: opts.candidate_id.clone(),
        rollout: Some(opts.rollout),
    };
    // The server's hints for the tools shown go with the trajectory into the store, as the claims they are.
    let shown: BTreeMap<String, ToolHints> = world
        .hints
        .iter()
        .filter(|(name, _)| trajectory.tool(name).is_some())
        .map(|(name, h)| (name.clone(), *h))
        .collect();
    trajectory.tool_annotations = shown;
    let result = TaskResult {
        task_id: task.id.clone(),
        owner: task.owner.clone(),
        success,
        score,
        feedback,
        final_answer: trajectory.final_answer.clone(),
        target_first: rollout.called.first().map(String::as_str) == Some(target),
        target_called: rollout.called.iter().any(|c| c == target),
        called: rollout.called,
        no_call_probability: moves.as_ref().map(|m| m.no_call),
        routing_probability: moves.as_ref().map(|m| m.routed),
        first_call_probabilities: moves.map(|m| m.tools),
        infra_failure: infra,
        trajectory_id: Some(trajectory.id().to_string()),
        first_move_samples: None,
        side_effect_calls,
        changed_fixture: world.changed,
        read_only_violations,
    };
    (result, trajectory)
}

fn summarise(
    suite: &Suite,
    target: String,
    mode: Mode,
    tasks: Vec<TaskResult>,
    timings: Timings,
    fixture: bool,
) -> SuiteResult {
    let mut side_effect_tools: Vec<String> = Vec::new();
    let mut read_only_violations: Vec<String> = Vec::new();
    for t in &tasks {
        for c in &t.side_effect_calls {
            if !side_effect_tools.contains(c) {
                side_effect_tools.push(c.clone());
            }
        }
        for c in &t.read_only_violations {
            if !read_only_violations.contains(c) {
                read_only_violations.push(c.clone());
            }
        }
    }
    let judged: Vec<&TaskResult> = tasks.iter().filter(|t| t.infra_failure.is_none()).collect();
    let n = judged.len() as u64;
    let successes = judged.iter().filter(|t| t.success).count() as u64;
    let selected = judged.iter().filter(|t| t.target_first).count() as u64;
    let off: Vec<&&TaskResult> = judged
        .iter()
        .filter(|t| t.owner.as_deref().is_some_and(|o| o != target))
        .collect();
    let off_selected = off.iter().filter(|t| t.target_first).count() as u64;
    let probs: Vec<f64> = tasks
        .iter()
        .filter_map(|t| t.first_call_probabilities.as_ref()?.get(&target).copied())
        .collect();
    let routed = judged
        .iter()
        .filter(|t| {
            tooltune_objectives::routed(t.owner.as_deref(), t.called.first().map(String::as_str))
        })
        .count() as u64;
    let routing_p: Vec<f64> = tasks.iter().filter_map(|t| t.routing_probability).collect();
    // Sampled estimates: every sampled first move of every task is one trial of "the right first move".
    let samples = tasks.iter().find_map(|t| t.first_move_samples);
    let expected_routing_interval = samples.map(|_| {
        let (hits, trials) = tasks
            .iter()
            .filter_map(|t| Some((t.routing_probability?, t.first_move_samples?)))
            .fold((0u64, 0u64), |(h, n), (p, k)| {
                (h + (p * f64::from(k)).round() as u64, n + u64::from(k))
            });
        let r = Rate::wilson(hits, trials);
        (r.low, r.high)
    });
    SuiteResult {
        suite: suite.name.clone(),
        target,
        mode,
        success_rate: if mode == Mode::Full {
            Rate::wilson(successes, n)
        } else {
            Rate::wilson(0, 0)
        },
        selection_rate: Rate::wilson(selected, n),
        off_target_selection: Rate::wilson(off_selected, off.len() as u64),
        expected_selection: (!probs.is_empty() && probs.len() == tasks.len())
            .then(|| probs.iter().sum::<f64>() / probs.len() as f64),
        routing: Rate::wilson(routed, n),
        expected_routing: (!routing_p.is_empty() && routing_p.len() == tasks.len())
            .then(|| routing_p.iter().sum::<f64>() / routing_p.len() as f64),
        first_move_samples: samples,
        expected_routing_interval,
        infra_failures: tasks.len() as u64 - n,
        tasks,
        timings,
        fixture,
        side_effect_tools,
        read_only_violations,
        trajectories: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["search_docs".into(), "web_search".into()]
    }

    #[test]
    fn sampled_first_moves_estimate_each_move_by_its_share() {
        let firsts = [
            Some("search_docs"),
            Some("search_docs"),
            Some("web_search"),
            None,
            Some("search_docs"),
            None,
            Some("web_search"),
            Some("search_docs"),
        ]
        .map(|f| f.map(String::from));
        let m = estimate_first_move(&names(), &firsts).expect("sampled");
        assert!((m.p_tool(0) - 4.0 / 8.0).abs() < 1e-12);
        assert!((m.p_tool(1) - 2.0 / 8.0).abs() < 1e-12);
        assert!((m.p_no_call() - 2.0 / 8.0).abs() < 1e-12);
        // A web task: its routing probability is the owner's share.
        let moves = FirstMoves::new(&names(), &m, Some("web_search"));
        assert!((moves.routed - 0.25).abs() < 1e-12);
        // The most likely move is the mode.
        assert_eq!(
            likeliest_first(&moves.tools, Some(moves.no_call)).as_deref(),
            Some("search_docs")
        );
    }

    #[test]
    fn a_call_of_an_unoffered_tool_is_no_candidate_and_nothing_sampled_is_no_estimate() {
        let firsts =
            [Some("search_docs"), Some("made_up"), None, None].map(|f| f.map(String::from));
        let m = estimate_first_move(&names(), &firsts).expect("sampled");
        assert!((m.p_tool(0) - 0.25).abs() < 1e-12);
        assert!((m.p_tool(1)).abs() < 1e-12);
        assert!((m.p_no_call() - 0.5).abs() < 1e-12);
        assert!(estimate_first_move(&names(), &[]).is_none());
        // Only answers: no call at all.
        let m = estimate_first_move(&names(), &[None, None]).expect("sampled");
        assert_eq!((m.p_call, m.p_tool(0)), (0.0, 0.0));
    }
}

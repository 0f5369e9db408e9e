//! Evaluating one candidate (a set of description overrides) on a suite: full rollouts against the real server,
//! scored by the suite's checks, and, when the backend can score exactly, the probability that the first call picks
//! each tool. Every rollout is stored as a trajectory linked to its run and candidate.
//!
//! The result types and the judging of rollouts are in `result`, the first-move estimates in `first_moves`.

mod branches;
mod first_moves;
mod result;

use crate::EvalError;
use crate::fixture::{self, Prepared, Workspace, check_world};
use crate::host::{ForcedMove, HostConfig, InfraFailure, RolloutTask, ToolServer, run_rollouts};
use crate::mcp::{CallOutcome, McpServer};
use crate::suite::{Split, Suite, Task};
use async_trait::async_trait;
pub use branches::{Branch, ExpectedSuccess, MIN_BRANCH_PROBABILITY};
pub use first_moves::estimate_first_move;
use first_moves::{FirstMoves, likeliest_first};
pub use result::{SuiteResult, TaskResult, Timings};
use result::{World, WorldChecks, judge, summarise};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tooltune_core::{ToolSpec, TrajectorySink};
use tooltune_llm::{ChatModel, ChatRequest, Message};

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
    /// Full mode: also play out every first move the model makes with some probability, not only its greedy one,
    /// and report each task's success in expectation over its first move (see `branches`). Needs exact
    /// first-move probabilities (the local backend); costs about one more rollout per likely move.
    pub expected_success: bool,
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
            expected_success: false,
        }
    }
}

/// Sampled first turns per task when the backend cannot score exactly. Eight keeps a screen of 40 tasks at 320
/// short completions (first turn only, a few dozen tokens each); a task's routing probability is then known to
/// within about ±0.3 (95%), and a suite's mean to within about ±0.05.
pub const DEFAULT_FIRST_MOVE_SAMPLES: u32 = 8;

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
    if opts.mode == Mode::Full {
        suite.needs_server(if opts.expected_success {
            "expected success (rollouts of every likely first move)"
        } else {
            "a full evaluation (rollouts scored by the tasks' checks)"
        })?;
    }
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
    let batch = batch_size(suite, opts);
    let chunks: Vec<&[&Task]> = tasks.chunks(batch).collect();
    let fixture = suite.fixture.as_ref().filter(|_| opts.mode == Mode::Full);
    // Workspaces (fixture copies with started servers) for the next chunk, prepared while this one runs.
    let mut prepared = fixture.map(|f| Prepared::start(f, &suite.server, 0, chunks[0].len()));
    let mut closing = Vec::new();
    let mut kept = Vec::new();
    let player = Player {
        suite,
        server,
        model,
        tools: &tools,
        host,
        target: &target,
        opts,
        hints: &hints,
        fixture,
    };
    // Each played task's first-move distribution, in `results` order (for the branches of expected success).
    let mut first_moves: Vec<Option<FirstMoves>> = Vec::new();
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
                        expected_success: None,
                    });
                }
            }
            Mode::Full => {
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
                let plays: Vec<(&Task, Option<ForcedMove>)> =
                    chunk.iter().map(|t| (*t, None)).collect();
                let judged = player
                    .play(
                        &plays,
                        workspaces,
                        moves.clone(),
                        &mut timings,
                        &mut closing,
                    )
                    .await?;
                let mut to_store = Vec::with_capacity(judged.len());
                for ((result, trajectory), m) in judged.into_iter().zip(moves) {
                    results.push(result);
                    first_moves.push(m);
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
    if opts.expected_success && opts.mode == Mode::Full {
        expected_success(
            &player,
            &tasks,
            &mut results,
            &first_moves,
            &mut timings,
            &mut closing,
            &mut progress,
        )
        .await?;
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

/// What playing a chunk of rollouts needs, shared by the greedy rollouts and the branches of expected success.
struct Player<'a> {
    suite: &'a Suite,
    server: &'a McpServer,
    model: &'a dyn ChatModel,
    tools: &'a [ToolSpec],
    host: &'a HostConfig,
    target: &'a str,
    opts: &'a EvalOptions,
    hints: &'a BTreeMap<String, crate::mcp::ToolHints>,
    fixture: Option<&'a crate::fixture::Fixture>,
}

impl Player<'_> {
    /// Plays `plays` (a task, and the first move imposed on it, if any) together, each on its workspace when the
    /// suite has a fixture, and judges each rollout.
    async fn play(
        &self,
        plays: &[(&Task, Option<ForcedMove>)],
        workspaces: Vec<Result<Workspace, EvalError>>,
        moves: Vec<Option<FirstMoves>>,
        timings: &mut Timings,
        closing: &mut Vec<tokio::task::JoinHandle<()>>,
    ) -> Result<Vec<(TaskResult, tooltune_core::Trajectory)>, EvalError> {
        let rollout_tasks: Vec<RolloutTask> = plays
            .iter()
            .map(|(t, forced)| RolloutTask {
                prompt: t.prompt.clone(),
                max_steps: t.max_steps,
                first_move: forced.clone(),
            })
            .collect();
        if let Some(r) = &self.suite.reset {
            r.run(&self.suite.dir).await?;
        }
        let adapters: Vec<Box<dyn ToolServer + '_>> = if self.fixture.is_none() {
            vec![Box::new(McpTools {
                server: self.server,
                timeout: self.opts.call_timeout,
            })]
        } else {
            workspaces
                .iter()
                .map(|w| -> Box<dyn ToolServer + '_> {
                    match w {
                        Ok(w) => Box::new(McpTools {
                            server: &w.server,
                            timeout: self.opts.call_timeout,
                        }),
                        Err(e) => Box::new(Unavailable(e.to_string())),
                    }
                })
                .collect()
        };
        let refs: Vec<&dyn ToolServer> = adapters.iter().map(|a| a.as_ref()).collect();
        let rollouts = run_rollouts(self.model, &refs, self.tools, &rollout_tasks, self.host).await;
        drop(refs);
        drop(adapters);
        // What each rollout did to its world: checks on the copy, and whether it changed at all.
        let mut worlds: Vec<(WorldChecks, Option<bool>)> = Vec::new();
        if let Some(f) = self.fixture {
            for ((task, _), w) in plays.iter().zip(&workspaces) {
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
        timings.tools_s += rollouts
            .iter()
            .map(|r| r.tool_time.as_secs_f64())
            .sum::<f64>();
        timings.model_s += rollouts
            .iter()
            .map(|r| r.model_time.as_secs_f64())
            .fold(0.0, f64::max);
        if rollouts.iter().any(|r| r.infra_failure.is_some()) && !self.server.is_alive().await {
            // The next chunk needs a live server; the failed rollouts stay marked as infrastructure errors.
            // A failed restart is not this chunk's error: the next chunk's calls then fail as
            // infrastructure errors and the restart is tried again after it, so it is logged, not returned.
            if let Err(e) = self.server.restart().await {
                tracing::warn!("restarting the MCP server after it died: {e}");
            }
        }
        let mut worlds = worlds.into_iter();
        Ok(plays
            .iter()
            .zip(rollouts)
            .zip(moves)
            .map(|(((task, _), rollout), m)| {
                let (world, changed) = worlds.next().unwrap_or_default();
                judge(
                    task,
                    rollout,
                    m,
                    self.target,
                    self.opts,
                    &World {
                        checks: &world,
                        changed,
                        hints: self.hints,
                    },
                )
            })
            .collect())
    }
}

/// Plays out, for every task with a first-move distribution, the first moves its greedy rollout did not take
/// (see `branches`), and sets each result's expected success. Branch rollouts are judged like any other but not
/// stored: the store's rollouts of a candidate stay its greedy ones, which everything else counts.
async fn expected_success(
    player: &Player<'_>,
    tasks: &[&Task],
    results: &mut [TaskResult],
    first_moves: &[Option<FirstMoves>],
    timings: &mut Timings,
    closing: &mut Vec<tokio::task::JoinHandle<()>>,
    progress: &mut (impl FnMut(usize, usize) + Send),
) -> Result<(), EvalError> {
    // (index into `results`, the move imposed)
    let mut plays: Vec<(usize, ForcedMove)> = Vec::new();
    for (i, (r, m)) in results.iter().zip(first_moves).enumerate() {
        let Some(m) = m else { continue };
        if r.infra_failure.is_some() {
            continue;
        }
        for mv in branches::to_play(m, &greedy_move(r)) {
            plays.push((i, mv));
        }
    }
    let total = tasks.len() + plays.len();
    let batch = batch_size(player.suite, player.opts);
    let mut outcomes: Vec<Vec<branches::Played>> = results.iter().map(|_| Vec::new()).collect();
    let mut done = tasks.len();
    for (c, chunk) in plays.chunks(batch).enumerate() {
        // Branch rollouts take the slots after the greedy ones', so their fixture folders have stable names too.
        let workspaces = match player.fixture {
            Some(f) => {
                Prepared::start(
                    f,
                    &player.suite.server,
                    tasks.len() + c * batch,
                    chunk.len(),
                )
                .take()
                .await
            }
            None => Vec::new(),
        };
        let task_plays: Vec<(&Task, Option<ForcedMove>)> = chunk
            .iter()
            .map(|(i, mv)| (tasks[*i], Some(mv.clone())))
            .collect();
        let judged = player
            .play(
                &task_plays,
                workspaces,
                chunk.iter().map(|_| None).collect(),
                timings,
                closing,
            )
            .await?;
        for ((i, mv), (r, _)) in chunk.iter().zip(judged) {
            outcomes[*i].push(branches::Played {
                first_move: mv.clone(),
                outcome: r.infra_failure.is_none().then_some(branches::Outcome {
                    success: r.success,
                    final_answer: r.final_answer,
                    called: r.called,
                    changed_fixture: r.changed_fixture,
                }),
                greedy: false,
            });
        }
        done += chunk.len();
        progress(done, total);
    }
    for ((r, m), mut played) in results.iter_mut().zip(first_moves).zip(outcomes) {
        let Some(m) = m else { continue };
        if r.infra_failure.is_some() {
            continue;
        }
        played.push(branches::Played {
            first_move: greedy_move(r),
            outcome: Some(branches::Outcome {
                success: r.success,
                final_answer: r.final_answer.clone(),
                called: r.called.clone(),
                changed_fixture: r.changed_fixture,
            }),
            greedy: true,
        });
        r.expected_success = Some(branches::combine(m, played));
    }
    Ok(())
}

/// How many rollouts advance together. A reset command cannot give rollouts that run together a state each: they
/// run one at a time.
fn batch_size(suite: &Suite, opts: &EvalOptions) -> usize {
    if suite.reset.is_some() {
        1
    } else {
        opts.batch.max(1)
    }
}

/// The first move a played rollout made: its first call, or an answer without one.
fn greedy_move(r: &TaskResult) -> ForcedMove {
    r.called
        .first()
        .map_or(ForcedMove::NoCall, |c| ForcedMove::Tool(c.clone()))
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
        format: None,
    }
}

//! The host agent loop: the model sees the tool list (with a candidate's descriptions), its tool calls go to the
//! real server, results go back to the model, up to a step limit, then a final answer.
//!
//! Rollouts of many tasks advance in lockstep: each round gathers the next model turn of every unfinished rollout
//! and asks the model for all of them at once (`chat_many`), so a backend that decodes several sequences in one
//! batch, and reuses the KV cache of the shared prefix (system text + tool list), does the work once per round
//! rather than once per task. Nothing here names a tool: the tool list comes from the server.

use crate::mcp::CallOutcome;
use async_trait::async_trait;
use serde_json::Value;
use std::time::{Duration, Instant};
use tooltune_core::{Meta, Outcome, Step, Timing, ToolCall, ToolSpec, Trajectory};
use tooltune_llm::{ChatModel, ChatRequest, Message, ToolChoice};

/// Why a rollout could not be judged on its merits: the model backend or the server failed, not the candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfraFailure {
    /// What failed.
    pub message: String,
}

/// What the host needs from a server: one tool call. Implemented by the MCP client; the host knows nothing else
/// about MCP.
#[async_trait]
pub trait ToolServer: Send + Sync {
    /// Calls a tool. `Err` is an infrastructure failure (the server died, timed out or broke the protocol); a tool
    /// that reports an error returns `Ok` with `is_error` set.
    async fn call(&self, name: &str, arguments: &Value) -> Result<CallOutcome, InfraFailure>;
}

/// What changes when the host's behaviour changes (its loop, prompts, parsing): bump it, and every stored
/// rollout key changes with it, and workers of another version stop taking this version's jobs.
pub const HOST_VERSION: &str = "host-2";

/// The SIMD path this build runs the local model on: greedy output differs between them (see MODELS.md), so it is
/// part of what a rollout is a function of.
pub fn simd_path() -> &'static str {
    if cfg!(target_feature = "avx512f") {
        "avx512"
    } else if cfg!(target_feature = "avx2") {
        "avx2"
    } else {
        "baseline"
    }
}

/// How the host runs rollouts.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// The system prompt. Deliberately neutral: it names no tool and does not steer selection.
    pub system_prompt: String,
    /// Upper bound on generated tokens per model turn.
    pub max_tokens: u32,
    /// Sampling temperature (0 = greedy, reproducible).
    pub temperature: f32,
    /// Seed for sampling.
    pub seed: Option<u64>,
    /// The user message that tells the model, once it has used its last tool-calling turn (or ended a turn with
    /// neither text nor a call), to answer now.
    /// The tools stay in the prompt (calls are ruled out by `ToolChoice::None`), so without this note a
    /// small model writes its next call out as text instead of answering. It names no tool.
    pub final_turn_note: String,
    /// Tool results longer than this many characters are cut before they go back to the model (the stored
    /// trajectory keeps them whole), so one huge file cannot blow the context.
    pub max_result_chars: usize,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            system_prompt:
                "You are a helpful assistant with tools. Call a tool when it helps with the task. \
                            When you have the answer, reply with the final answer only."
                    .to_string(),
            max_tokens: 256,
            temperature: 0.0,
            seed: None,
            final_turn_note:
                "You cannot call any more tools. Using what you found so far, reply with the \
                              final answer only."
                    .to_string(),
            max_result_chars: 4000,
        }
    }
}

/// One task to roll out.
#[derive(Debug, Clone)]
pub struct RolloutTask {
    /// The task text the user gives.
    pub prompt: String,
    /// The most model turns that may call tools; one more turn without tools produces the final answer.
    pub max_steps: u32,
    /// The first move, when it is imposed rather than the model's: the rollout then shows what follows a move
    /// the model makes with some probability (a branch of the first-move distribution). Later turns are the
    /// model's own.
    pub first_move: Option<ForcedMove>,
}

/// A first move imposed on a rollout.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum ForcedMove {
    /// The first turn calls this tool (its arguments are the model's).
    Tool(String),
    /// The first turn answers without a tool.
    NoCall,
}

/// The result of one rollout.
#[derive(Debug, Clone)]
pub struct Rollout {
    /// The trajectory, ready to store (outcome still empty: the suite's checks fill it).
    pub trajectory: Trajectory,
    /// Tools called, in order.
    pub called: Vec<String>,
    /// Set when the model backend or the server failed.
    pub infra_failure: Option<InfraFailure>,
    /// Wall time of the rollout's own model and tool work.
    pub elapsed: Duration,
    /// Time spent waiting for tool calls.
    pub tool_time: Duration,
    /// Wall time of the model rounds this rollout took part in (rounds are shared by all rollouts advancing
    /// together, so across a batch the largest of these is the batch's time in the model).
    pub model_time: Duration,
}

struct Live {
    messages: Vec<Message>,
    steps: Vec<Step>,
    called: Vec<String>,
    model_turns: u32,
    final_answer: Option<String>,
    failure: Option<InfraFailure>,
    done: bool,
    told_to_answer: bool,
    tool_time: Duration,
    model_time: Duration,
    call_ids: std::collections::HashSet<String>,
}

impl Live {
    /// Asks the model for its final answer, once: the note goes into the conversation and the stored steps, and
    /// from then on the model is offered no tool.
    fn tell_to_answer(&mut self, note: &str) {
        self.told_to_answer = true;
        self.messages.push(Message::user(note.to_string()));
        self.steps.push(Step::User {
            content: note.to_string(),
        });
    }
}

/// Runs every task to its end, with `tools` (already carrying the candidate's descriptions) as the tool list the
/// model sees. `servers` holds one server shared by every task, or one per task (a rollout on its own copy of a
/// fixture).
pub async fn run_rollouts(
    model: &dyn ChatModel,
    servers: &[&dyn ToolServer],
    tools: &[ToolSpec],
    tasks: &[RolloutTask],
    cfg: &HostConfig,
) -> Vec<Rollout> {
    assert!(
        servers.len() == 1 || servers.len() == tasks.len(),
        "run_rollouts needs one server, or one per task"
    );
    let server_of = |i: usize| servers[if servers.len() == 1 { 0 } else { i }];
    let started = Instant::now();
    let mut live: Vec<Live> = tasks
        .iter()
        .map(|t| Live {
            messages: vec![
                Message::system(cfg.system_prompt.clone()),
                Message::user(t.prompt.clone()),
            ],
            steps: Vec::new(),
            called: Vec::new(),
            model_turns: 0,
            final_answer: None,
            failure: None,
            done: false,
            told_to_answer: false,
            tool_time: Duration::ZERO,
            model_time: Duration::ZERO,
            call_ids: Default::default(),
        })
        .collect();
    loop {
        let active: Vec<usize> = (0..live.len()).filter(|&i| !live[i].done).collect();
        if active.is_empty() {
            break;
        }
        for &i in &active {
            let l = &mut live[i];
            // Past the step limit the model must answer without tools, and is told so once.
            if l.model_turns >= tasks[i].max_steps && !l.told_to_answer {
                l.tell_to_answer(&cfg.final_turn_note);
            }
        }
        let requests: Vec<ChatRequest> = active
            .iter()
            .map(|&i| {
                let l = &live[i];
                // Told to answer (at the step limit, or after an empty turn): no more calls.
                let out_of_steps = l.told_to_answer || l.model_turns >= tasks[i].max_steps;
                let forced = (l.model_turns == 0)
                    .then_some(tasks[i].first_move.as_ref())
                    .flatten();
                ChatRequest {
                    messages: l.messages.clone(),
                    tools: tools.to_vec(),
                    tool_choice: match forced {
                        _ if out_of_steps => ToolChoice::None,
                        Some(ForcedMove::Tool(name)) => ToolChoice::Tool(name.clone()),
                        Some(ForcedMove::NoCall) => ToolChoice::None,
                        None => ToolChoice::Auto,
                    },
                    max_tokens: cfg.max_tokens,
                    temperature: cfg.temperature,
                    seed: cfg.seed,
                    format: None,
                }
            })
            .collect();
        let turn_started = now_rfc3339();
        let t0 = Instant::now();
        let responses = model.chat_many(&requests).await;
        tracing::debug!(
            turns = active.len(),
            seconds = t0.elapsed().as_secs_f64(),
            "model round",
        );
        // Turns decoded together share one wall time; each is charged its share.
        let per_turn_ms = t0.elapsed().as_secs_f64() * 1000.0 / active.len().max(1) as f64;
        let round = t0.elapsed();
        for &i in &active {
            live[i].model_time += round;
        }
        for (&i, response) in active.iter().zip(responses) {
            let l = &mut live[i];
            l.model_turns += 1;
            let response = match response {
                Ok(r) => r,
                Err(e) => {
                    l.failure = Some(InfraFailure {
                        message: format!("model backend: {e}"),
                    });
                    l.done = true;
                    continue;
                }
            };
            tracing::debug!(
                prompt_tokens = response.usage.prompt_tokens,
                completion_tokens = response.usage.completion_tokens,
                content = response.content.as_deref().unwrap_or(""),
                calls = ?response.tool_calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
                "model turn",
            );
            let calls: Vec<ToolCall> = response
                .tool_calls
                .iter()
                .enumerate()
                .map(|(k, c)| {
                    // A backend may reuse an id within a conversation (nothing in the chat format forbids
                    // it); results must point at exactly one call, so a repeated id is replaced.
                    let id =
                        c.id.clone()
                            .filter(|id| !l.call_ids.contains(id))
                            .unwrap_or_else(|| format!("call_{}_{k}", l.model_turns));
                    l.call_ids.insert(id.clone());
                    ToolCall {
                        id: Some(id),
                        name: c.name.clone(),
                        arguments: c.arguments.clone(),
                    }
                })
                .collect();
            l.steps.push(Step::Model {
                content: response.content.clone(),
                tool_calls: calls.clone(),
                timing: Timing {
                    started_at: Some(turn_started.clone()),
                    duration_ms: Some(per_turn_ms),
                },
                usage: Some(response.usage),
            });
            l.messages.push(Message::Assistant {
                content: response.content.clone(),
                tool_calls: calls.clone(),
            });
            if calls.is_empty() {
                let empty = response
                    .content
                    .as_deref()
                    .is_none_or(|c| c.trim().is_empty());
                if empty && !l.told_to_answer {
                    // A turn with neither text nor a call is no answer: small models end their turn right after
                    // a tool result as if the result had been the reply. The host asks once for the answer
                    // (the same note as at the step limit, naming no tool) instead of scoring silence.
                    l.tell_to_answer(&cfg.final_turn_note);
                    continue;
                }
                l.final_answer = response.content.clone();
                l.done = true;
                continue;
            }
            for call in &calls {
                l.called.push(call.name.clone());
                let call_started = now_rfc3339();
                let tc = Instant::now();
                let outcome = if tools.iter().any(|t| t.name == call.name) {
                    server_of(i).call(&call.name, &call.arguments).await
                } else {
                    // A backend without constrained decoding can name a tool that does not exist; the model hears
                    // about it like a real host would tell it.
                    Ok(CallOutcome {
                        content_text: format!("error: there is no tool named `{}`", call.name),
                        is_error: true,
                        duration: Duration::ZERO,
                    })
                };
                let took = tc.elapsed();
                l.tool_time += took;
                match outcome {
                    Ok(out) => {
                        l.steps.push(Step::ToolResult {
                            call_id: call.id.clone(),
                            name: call.name.clone(),
                            content: out.content_text.clone(),
                            is_error: out.is_error,
                            timing: Timing {
                                started_at: Some(call_started),
                                duration_ms: Some(took.as_secs_f64() * 1000.0),
                            },
                        });
                        l.messages.push(Message::Tool {
                            call_id: call.id.clone(),
                            name: call.name.clone(),
                            content: truncate(&out.content_text, cfg.max_result_chars),
                        });
                    }
                    Err(f) => {
                        l.failure = Some(f);
                        l.done = true;
                        break;
                    }
                }
            }
        }
    }
    let elapsed = started.elapsed();
    live.into_iter()
        .zip(tasks)
        .map(|(l, t)| {
            // Steps naming tools outside the list (an unconstrained backend's invention) would fail validation;
            // they are kept in `called` but the trajectory's tool list is what the model was shown.
            let mut trajectory = Trajectory {
                task: t.prompt.clone(),
                system: Some(cfg.system_prompt.clone()),
                tools: tools.to_vec(),
                // Hints come from the server's tool list, which the caller holds (`evaluate::judge` adds them).
                tool_annotations: Default::default(),
                steps: l.steps,
                final_answer: l.final_answer,
                outcome: Outcome::default(),
                meta: Meta {
                    source: "evaluator".into(),
                    model: Some(model.id()),
                    client: Some("tooltune".into()),
                    external_id: None,
                    started_at: None,
                },
                links: Default::default(),
            };
            drop_unknown_tool_steps(&mut trajectory);
            Rollout {
                trajectory,
                called: l.called,
                infra_failure: l.failure,
                elapsed,
                tool_time: l.tool_time,
                model_time: l.model_time,
            }
        })
        .collect()
}

fn drop_unknown_tool_steps(t: &mut Trajectory) {
    let names: std::collections::HashSet<String> = t.tools.iter().map(|x| x.name.clone()).collect();
    for s in &mut t.steps {
        if let Step::Model {
            tool_calls,
            content,
            ..
        } = s
        {
            let unknown: Vec<String> = tool_calls
                .iter()
                .filter(|c| !names.contains(&c.name))
                .map(|c| c.name.clone())
                .collect();
            if !unknown.is_empty() {
                tool_calls.retain(|c| names.contains(&c.name));
                let note = format!("[called unknown tool(s): {}]", unknown.join(", "));
                *content = Some(match content.take() {
                    Some(c) => format!("{c}\n{note}"),
                    None => note,
                });
            }
        }
    }
    t.steps
        .retain(|s| !matches!(s, Step::ToolResult { name, .. } if !names.contains(name)));
}

fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let cut: String = s.chars().take(max).collect();
    format!("{cut}\n[... cut at {max} characters]")
}

fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use tooltune_core::Usage;
    use tooltune_llm::{ChatResponse, FinishReason, LlmError};

    /// A scripted fake model for the loop's logic: replies in order, and remembers what it was asked.
    struct ScriptedFakeAgent {
        replies: Mutex<Vec<ChatResponse>>,
        seen: Mutex<Vec<ChatRequest>>,
    }

    fn reply(content: Option<&str>, call: Option<&str>) -> ChatResponse {
        ChatResponse {
            content: content.map(str::to_string),
            tool_calls: call
                .map(|name| ToolCall {
                    id: None,
                    name: name.into(),
                    arguments: serde_json::json!({}),
                })
                .into_iter()
                .collect(),
            usage: Usage::default(),
            finish_reason: FinishReason::Stop,
        }
    }

    #[async_trait]
    impl ChatModel for ScriptedFakeAgent {
        fn id(&self) -> String {
            "fake:scripted".into()
        }
        async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
            self.seen.lock().expect("lock").push(req.clone());
            Ok(self.replies.lock().expect("lock").remove(0))
        }
        fn usage_total(&self) -> Usage {
            Usage::default()
        }
    }

    struct EchoServer;

    #[async_trait]
    impl ToolServer for EchoServer {
        async fn call(&self, name: &str, _arguments: &Value) -> Result<CallOutcome, InfraFailure> {
            Ok(CallOutcome {
                content_text: format!("{name} ran"),
                is_error: false,
                duration: Duration::ZERO,
            })
        }
    }

    fn tool(name: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: String::new(),
            input_schema: serde_json::json!({}).into(),
        }
    }

    #[tokio::test]
    async fn an_empty_turn_is_asked_once_for_the_answer_without_tools() {
        let model = ScriptedFakeAgent {
            replies: Mutex::new(vec![
                reply(None, Some("a")),
                reply(Some("  "), None),
                reply(Some("42"), None),
            ]),
            seen: Mutex::new(Vec::new()),
        };
        let task = RolloutTask {
            prompt: "q".into(),
            max_steps: 5,
            first_move: None,
        };
        let cfg = HostConfig::default();
        let out = run_rollouts(&model, &[&EchoServer], &[tool("a")], &[task], &cfg).await;
        let r = &out[0];
        assert_eq!(r.trajectory.final_answer.as_deref(), Some("42"));
        assert_eq!(r.called, ["a"]);
        let seen = model.seen.lock().expect("lock");
        assert_eq!(seen.len(), 3);
        assert!(matches!(seen[1].tool_choice, ToolChoice::Auto));
        // The third request carries the note and allows no call.
        assert!(matches!(seen[2].tool_choice, ToolChoice::None));
        assert!(matches!(seen[2].messages.last(),
            Some(Message::User { content }) if *content == cfg.final_turn_note));
        // The stored trajectory shows the empty turn and the note, as the model saw them.
        assert!(
            r.trajectory
                .steps
                .iter()
                .any(|s| matches!(s, Step::User { content } if *content == cfg.final_turn_note))
        );
    }

    #[tokio::test]
    async fn a_second_empty_turn_ends_the_rollout_without_an_answer() {
        let model = ScriptedFakeAgent {
            replies: Mutex::new(vec![reply(None, None), reply(None, None)]),
            seen: Mutex::new(Vec::new()),
        };
        let task = RolloutTask {
            prompt: "q".into(),
            max_steps: 5,
            first_move: None,
        };
        let out = run_rollouts(
            &model,
            &[&EchoServer],
            &[tool("a")],
            &[task],
            &HostConfig::default(),
        )
        .await;
        assert_eq!(out[0].trajectory.final_answer, None);
        assert_eq!(model.seen.lock().expect("lock").len(), 2);
    }

    #[tokio::test]
    async fn an_imposed_first_move_binds_the_first_turn_only() {
        let model = ScriptedFakeAgent {
            replies: Mutex::new(vec![
                reply(None, Some("b")),
                reply(None, Some("a")),
                reply(Some("done"), None),
            ]),
            seen: Mutex::new(Vec::new()),
        };
        let task = RolloutTask {
            prompt: "q".into(),
            max_steps: 2,
            first_move: Some(ForcedMove::Tool("b".into())),
        };
        let out = run_rollouts(
            &model,
            &[&EchoServer],
            &[tool("a"), tool("b")],
            &[task],
            &HostConfig::default(),
        )
        .await;
        assert_eq!(out[0].called, ["b", "a"]);
        let seen = model.seen.lock().expect("lock").clone();
        assert_eq!(seen[0].tool_choice, ToolChoice::Tool("b".into()));
        assert_eq!(seen[0].tools.len(), 2, "every tool stays in the prompt");
        assert_eq!(
            seen[1].tool_choice,
            ToolChoice::Auto,
            "the model's own second turn"
        );
        assert_eq!(seen[2].tool_choice, ToolChoice::None, "at the step limit");
        // Answering without a tool, imposed: the first turn may not call.
        let model = ScriptedFakeAgent {
            replies: Mutex::new(vec![reply(Some("42"), None)]),
            seen: Mutex::new(Vec::new()),
        };
        let task = RolloutTask {
            prompt: "q".into(),
            max_steps: 2,
            first_move: Some(ForcedMove::NoCall),
        };
        let out = run_rollouts(
            &model,
            &[&EchoServer],
            &[tool("a")],
            &[task],
            &HostConfig::default(),
        )
        .await;
        assert_eq!(out[0].trajectory.final_answer.as_deref(), Some("42"));
        assert_eq!(
            model.seen.lock().expect("lock")[0].tool_choice,
            ToolChoice::None
        );
    }
}

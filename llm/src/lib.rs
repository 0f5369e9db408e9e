//! Language-model backends for tooltune: one small [`ChatModel`] trait, an embedded llama.cpp backend
//! ([`local::LocalModel`]) and an OpenAI-compatible HTTP backend ([`openai::OpenAiModel`]).
//!
//! The evaluator (the agent that picks tools) and the optimizer (the reflector that rewrites descriptions)
//! talk only to [`ChatModel`]. Which backend plays which role is decided in one place, [`config`]. The
//! embedded model's weights are fetched by [`fetch`]; [`serve`] exposes the embedded model over an
//! OpenAI-compatible HTTP API so other tools can use the same model.

pub mod config;
mod error;
pub mod fetch;
mod format;
#[cfg(feature = "local")]
pub mod local;
#[cfg(feature = "openai")]
pub mod openai;
mod secret;
#[cfg(feature = "serve")]
pub mod serve;
pub mod wire;

pub use config::{BackendConfig, BackendSpec, Roles, build, build_roles};
pub use error::LlmError;
pub use fetch::{ModelChoice, default_models_dir, ensure_model, fetch_model, file_sha256};
pub use format::{ReplyField, ReplyFormat};
pub use secret::Secret;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tooltune_core::{ToolCall, ToolSpec, Usage};

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    /// Instructions for the model.
    System {
        /// The text.
        content: String,
    },
    /// The user's request.
    User {
        /// The text.
        content: String,
    },
    /// An earlier model turn.
    Assistant {
        /// Text the model wrote, if any.
        #[serde(default)]
        content: Option<String>,
        /// Tool calls the model made.
        #[serde(default)]
        tool_calls: Vec<ToolCall>,
    },
    /// The result of a tool call.
    Tool {
        /// The id of the call this answers (backends invent one when the call had none).
        #[serde(default)]
        call_id: Option<String>,
        /// The tool that produced it.
        name: String,
        /// The result as text.
        content: String,
    },
}

impl Message {
    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Message::System {
            content: content.into(),
        }
    }
    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Message::User {
            content: content.into(),
        }
    }
}

/// Whether the model may, must or must not call a tool.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides (the default).
    #[default]
    Auto,
    /// The model must call one of the tools.
    Required,
    /// The model must answer in text. The tools stay in what the model sees (as hosted APIs keep them); only
    /// calling them is ruled out.
    None,
    /// The model must call this tool (OpenAI's named function choice). Every tool stays in what the model sees,
    /// so the call's arguments are written in the same context as an unforced call: the evaluator uses it to
    /// play out the first moves the model did not pick greedily.
    Tool(String),
}

/// One chat-completion request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// The conversation so far.
    pub messages: Vec<Message>,
    /// The tools the model may call, with the descriptions it reads.
    #[serde(default)]
    pub tools: Vec<ToolSpec>,
    /// Whether a tool call is allowed, required or forbidden.
    #[serde(default)]
    pub tool_choice: ToolChoice,
    /// Upper bound on generated tokens.
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    /// Sampling temperature; `0` (the default) is greedy decoding.
    #[serde(default)]
    pub temperature: f32,
    /// Seed for sampling when `temperature > 0`.
    #[serde(default)]
    pub seed: Option<u64>,
    /// The shape a text reply must take (requests without tools). The embedded model is held to it by a
    /// grammar; remote endpoints read it from the prompt only (see [`ReplyFormat`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<ReplyFormat>,
}

fn default_max_tokens() -> u32 {
    512
}

impl ChatRequest {
    /// A greedy request with these messages and tools and the default token limit.
    pub fn new(messages: Vec<Message>, tools: Vec<ToolSpec>) -> Self {
        ChatRequest {
            messages,
            tools,
            tool_choice: ToolChoice::Auto,
            max_tokens: default_max_tokens(),
            temperature: 0.0,
            seed: None,
            format: None,
        }
    }

    /// A plain text completion (no tools): what the reflector uses.
    pub fn text(messages: Vec<Message>) -> Self {
        ChatRequest::new(messages, Vec::new())
    }
}

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model ended its turn.
    Stop,
    /// The model ended its turn with tool calls.
    ToolCalls,
    /// `max_tokens` (or the context) was reached.
    Length,
    /// Anything else the endpoint reported (content filter and the like).
    Other,
}

/// One model turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatResponse {
    /// Text the model wrote, if any (without the tool-call markup).
    pub content: Option<String>,
    /// Tool calls, each naming a tool from the request with JSON arguments.
    pub tool_calls: Vec<ToolCall>,
    /// Tokens this turn used.
    pub usage: Usage,
    /// Why generation stopped.
    pub finish_reason: FinishReason,
}

/// The distribution of a model's first move on a request: call one of the candidate tools, or answer without one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FirstMove {
    /// For each candidate, P(the first tool call names it | the model calls a tool); sums to 1.
    pub given_call: Vec<f64>,
    /// P(the model's reply starts with a tool call).
    pub p_call: f64,
}

impl FirstMove {
    /// P(the first move is a call of candidate `i`).
    pub fn p_tool(&self, i: usize) -> f64 {
        self.p_call * self.given_call.get(i).copied().unwrap_or(0.0)
    }

    /// P(the model answers without calling a tool first).
    pub fn p_no_call(&self) -> f64 {
        1.0 - self.p_call
    }
}

/// A chat model with tools, as tooltune's agent and reflector need it.
///
/// Backends must be usable from many tasks at once; they limit their own concurrency.
#[async_trait]
pub trait ChatModel: Send + Sync {
    /// A stable id for logs and trajectories, e.g. `local:qwen2.5-coder-1.5b` or
    /// `openai:gpt-4o-mini@https://host/v1`.
    fn id(&self) -> String;

    /// Settings beside the id that change greedy output (`""` when none differ from the backend's defaults): for
    /// the embedded model, a thread count other than the default, since llama.cpp's results depend on how its
    /// work is split (measured: a contractor task answered without a tool on 2 threads called `search_docs` on
    /// 1). Part of what a cached rollout and a worker's job are a function of.
    fn numerics(&self) -> String {
        String::new()
    }

    /// One chat completion. With `tools` empty this is a plain text completion.
    async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError>;

    /// Several independent completions. The default runs them concurrently and lets the backend's own
    /// limits apply; the local backend decodes them as parallel sequences of one batch.
    async fn chat_many(&self, reqs: &[ChatRequest]) -> Vec<Result<ChatResponse, LlmError>> {
        futures::future::join_all(reqs.iter().map(|r| self.chat(r))).await
    }

    /// Exact tool-selection probabilities: for each candidate tool name, the probability that the model's
    /// first tool call names it, renormalised over the candidates (so they sum to 1). `Ok(None)` means this
    /// backend cannot score exactly; callers then fall back to sampling [`ChatModel::chat`]. That is the default:
    /// only a backend that sees the model's full distribution (the local one) can do better.
    async fn score_tool_choice(
        &self,
        _req: &ChatRequest,
        _candidates: &[String],
    ) -> Result<Option<Vec<f64>>, LlmError> {
        Ok(None)
    }

    /// [`ChatModel::score_tool_choice`] for several requests; the local backend shares the work of a common
    /// prompt prefix between them.
    async fn score_many(
        &self,
        reqs: &[ChatRequest],
        candidates: &[String],
    ) -> Vec<Result<Option<Vec<f64>>, LlmError>> {
        let mut out = Vec::with_capacity(reqs.len());
        for r in reqs {
            out.push(self.score_tool_choice(r, candidates).await);
        }
        out
    }

    /// Exact first moves for several requests: for each, the probability of calling each candidate tool first
    /// and of answering without a tool. `Ok(None)` where the backend cannot score exactly (the default); only a
    /// backend that sees the model's full distribution (the local one) can.
    async fn score_first_moves(
        &self,
        reqs: &[ChatRequest],
        _candidates: &[String],
    ) -> Vec<Result<Option<FirstMove>, LlmError>> {
        reqs.iter().map(|_| Ok(None)).collect()
    }

    /// Tokens used so far by this backend instance (all requests, including retries' successful answers).
    fn usage_total(&self) -> Usage;
}

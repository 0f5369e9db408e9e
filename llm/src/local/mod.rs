//! The embedded backend: a Qwen2.5-Coder GGUF run by llama.cpp on a dedicated thread.
//!
//! # What exact scoring scores
//! [`LocalModel`]'s `score_tool_choice` renders the request with the model's chat template (system text,
//! `<tools>` block, messages, then `<|im_start|>assistant\n`), appends `<tool_call>\n{"name": "` (the
//! exact text Qwen writes before a tool's name) and, for each candidate name, sums the log-probabilities
//! of the name's tokens followed by *any token that begins with the closing quote `"`* (that token ends
//! the JSON string; without it, a name that is a prefix of another, like `search` and `search_docs`, would
//! be favoured). The probabilities are then renormalised over the candidates with a softmax. So a score is
//! P(first tool call names c | the model calls a tool, and names one of the candidates) under the model's
//! own tokenisation of the name. The prompt is decoded once; each candidate continues from a copy of its
//! KV cache, and all candidates are decoded in one batch.
//!
//! `score_first_moves` adds the move "answer without a tool": the logits after `<|im_start|>assistant\n` (the
//! same decode, one more row) give P(the reply's first token starts a tool call), summed over every token the
//! host takes for a call's start when it comes first (`<tool_call>`, or a piece opening a code fence or a JSON
//! object). P(first move = tool c) is that times the renormalised name score; P(no call) is the rest. A reply
//! that writes text first and calls a tool later counts as no call: the first move is what is scored.
//!
//! # Prefix reuse
//! The KV cache of the last prompt is kept; a new prompt decodes only the tokens after the longest common
//! prefix. Tasks that share system text and tool list pay for that part once.

pub mod check;
mod engine;
pub(crate) mod grammar;
pub mod template;

use crate::fetch::{ModelChoice, ensure_model};
use crate::{ChatModel, ChatRequest, ChatResponse, FirstMove, LlmError};
use async_trait::async_trait;
use engine::{Engine, Job, N_SEQ};
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::LlamaModelParams;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use tokio::sync::oneshot;
use tooltune_core::Usage;

/// How to load the embedded model.
#[derive(Debug, Clone)]
pub struct LocalOptions {
    /// Which model (`default` = 1.5B, `fast` = 0.5B).
    pub model: ModelChoice,
    /// The models folder (default: [`crate::default_models_dir`]). The model is fetched there if missing.
    pub models_dir: Option<PathBuf>,
    /// Use this GGUF file instead of a fetched one (it must have a Qwen-style chat template).
    pub model_path: Option<PathBuf>,
    /// Context size in tokens, shared by all sequences (the prefix cache, candidates, parallel chats).
    pub n_ctx: u32,
    /// CPU threads for llama.cpp.
    pub threads: i32,
    /// How many requests `chat_many` decodes in one batch.
    pub n_parallel: usize,
    /// Keep and reuse the KV cache of the last prompt.
    pub prefix_reuse: bool,
    /// Show a progress bar when the model has to be fetched.
    pub progress: bool,
}

impl Default for LocalOptions {
    fn default() -> Self {
        LocalOptions {
            model: ModelChoice::Default,
            models_dir: None,
            model_path: None,
            n_ctx: 8192,
            threads: 2,
            n_parallel: 4,
            prefix_reuse: true,
            progress: true,
        }
    }
}

impl LocalOptions {
    /// Defaults for one model choice.
    pub fn for_model(model: ModelChoice) -> Self {
        LocalOptions {
            model,
            ..Default::default()
        }
    }
}

/// Counters of the work the worker did, for benchmarks and diagnostics.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LocalStats {
    /// Prompt tokens actually decoded.
    pub prompt_tokens_decoded: u64,
    /// Prompt tokens whose KV cache was reused instead of decoded.
    pub prompt_tokens_reused: u64,
    /// Tokens generated (including forced tool-call markup).
    pub generated_tokens: u64,
    /// Seconds spent decoding prompts.
    pub prefill_seconds: f64,
    /// Seconds spent generating.
    pub generate_seconds: f64,
    /// Scoring requests served.
    pub scoring_calls: u64,
    /// Seconds spent in scoring requests (prefill included).
    pub scoring_seconds: f64,
}

impl LocalStats {
    /// The work done since `earlier` (a snapshot taken from the same model).
    pub fn since(&self, earlier: &LocalStats) -> LocalStats {
        LocalStats {
            prompt_tokens_decoded: self.prompt_tokens_decoded - earlier.prompt_tokens_decoded,
            prompt_tokens_reused: self.prompt_tokens_reused - earlier.prompt_tokens_reused,
            generated_tokens: self.generated_tokens - earlier.generated_tokens,
            prefill_seconds: self.prefill_seconds - earlier.prefill_seconds,
            generate_seconds: self.generate_seconds - earlier.generate_seconds,
            scoring_calls: self.scoring_calls - earlier.scoring_calls,
            scoring_seconds: self.scoring_seconds - earlier.scoring_seconds,
        }
    }
}

/// The embedded model. Cheap to share (`Arc`); requests are queued to its worker thread.
pub struct LocalModel {
    id: String,
    /// See [`numerics_for_threads`].
    numerics: String,
    tx: Mutex<std::sync::mpsc::Sender<Job>>,
    usage: Mutex<Usage>,
    stats: Arc<Mutex<LocalStats>>,
}

impl std::fmt::Debug for LocalModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalModel")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// llama.cpp's backend is process-wide and may be initialised only once.
fn backend() -> Result<&'static LlamaBackend, LlmError> {
    static BACKEND: OnceLock<Result<LlamaBackend, String>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            // llama.cpp logs every tensor at load time; send it to tracing, where it is filtered.
            llama_cpp_2::send_logs_to_tracing(llama_cpp_2::LogOptions::default());
            LlamaBackend::init().map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| LlmError::Local {
            model: "llama.cpp".into(),
            message: format!("initialising the backend: {e}"),
        })
}

impl LocalModel {
    /// Loads the model (fetching it first if missing) on a new worker thread.
    pub async fn load(opts: LocalOptions) -> Result<Self, LlmError> {
        let path = match &opts.model_path {
            Some(p) => p.clone(),
            None => ensure_model(opts.model, opts.models_dir.as_deref(), opts.progress).await?,
        };
        let id = match &opts.model_path {
            Some(p) => format!(
                "local:{}",
                p.file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default()
            ),
            None => format!("local:{}", opts.model.info().name),
        };
        let stats = Arc::new(Mutex::new(LocalStats::default()));
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = oneshot::channel::<Result<(), LlmError>>();
        let worker_stats = stats.clone();
        std::thread::Builder::new()
            .name("tooltune-llm".into())
            .spawn(move || {
                let name = path
                    .file_name()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let fail = |m: String| LlmError::Local {
                    model: name.clone(),
                    message: m,
                };
                let backend = match backend() {
                    Ok(b) => b,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let model = match LlamaModel::load_from_file(
                    backend,
                    &path,
                    &LlamaModelParams::default(),
                ) {
                    Ok(m) => m,
                    Err(e) => {
                        let _ =
                            ready_tx.send(Err(fail(format!("loading {}: {e}", path.display()))));
                        return;
                    }
                };
                let template = match model
                    .chat_template(None)
                    .map_err(|e| e.to_string())
                    .and_then(|t| t.to_string().map_err(|e| e.to_string()))
                    .map_err(|e| fail(format!("the GGUF has no usable chat template: {e}")))
                    .and_then(|src| template::ChatTemplate::new(&src))
                {
                    Ok(t) => t,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let params = LlamaContextParams::default()
                    .with_n_ctx(NonZeroU32::new(opts.n_ctx.max(512)))
                    .with_n_batch(512)
                    .with_n_ubatch(512)
                    .with_n_seq_max(N_SEQ as u32)
                    .with_kv_unified(true)
                    .with_n_threads(opts.threads)
                    .with_n_threads_batch(opts.threads);
                let ctx = match model.new_context(backend, params) {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = ready_tx.send(Err(fail(format!("creating the context: {e}"))));
                        return;
                    }
                };
                let engine = Engine::new(
                    &model,
                    ctx,
                    template,
                    name.clone(),
                    opts.n_parallel,
                    opts.prefix_reuse,
                    worker_stats,
                );
                let _ = ready_tx.send(Ok(()));
                engine.run(rx);
            })
            .map_err(|e| LlmError::Local {
                model: id.clone(),
                message: format!("starting the worker thread: {e}"),
            })?;
        ready_rx
            .await
            .map_err(|_| LlmError::WorkerGone("the worker stopped while loading".into()))??;
        Ok(LocalModel {
            id,
            numerics: numerics_for_threads(opts.threads),
            tx: Mutex::new(tx),
            usage: Mutex::new(Usage::default()),
            stats,
        })
    }

    fn send(&self, job: Job) -> Result<(), LlmError> {
        let tx = self
            .tx
            .lock()
            .map_err(|_| LlmError::WorkerGone("the job queue is poisoned".into()))?;
        tx.send(job)
            .map_err(|_| LlmError::WorkerGone("the worker thread has exited".into()))
    }

    /// Counters of the work done so far.
    pub fn stats(&self) -> LocalStats {
        self.stats.lock().map(|s| *s).unwrap_or_default()
    }

    /// Turns reuse of the prompt-prefix KV cache on or off; either way the cache is dropped.
    pub async fn set_prefix_reuse(&self, on: bool) -> Result<(), LlmError> {
        let (reply, rx) = oneshot::channel();
        self.send(Job::SetPrefixReuse { on, reply })?;
        rx.await
            .map_err(|_| LlmError::WorkerGone("no answer to set_prefix_reuse".into()))
    }

    /// Drops the prompt-prefix KV cache (the engine check's probe leaves the model as loading left it).
    pub async fn drop_prefix_cache(&self) -> Result<(), LlmError> {
        let (reply, rx) = oneshot::channel();
        self.send(Job::DropCache { reply })?;
        rx.await
            .map_err(|_| LlmError::WorkerGone("no answer to drop_prefix_cache".into()))
    }

    fn add_usage(&self, u: Usage) {
        if let Ok(mut t) = self.usage.lock() {
            t.prompt_tokens += u.prompt_tokens;
            t.completion_tokens += u.completion_tokens;
        }
    }
}

/// What [`ChatModel::numerics`] says for an embedded model on `threads` threads: `""` for the default count (so the
/// content addresses of results made before thread counts were told apart stay valid), else the count.
pub fn numerics_for_threads(threads: i32) -> String {
    if threads == LocalOptions::default().threads {
        String::new()
    } else {
        format!("{threads} threads")
    }
}

#[async_trait]
impl ChatModel for LocalModel {
    fn id(&self) -> String {
        self.id.clone()
    }

    fn numerics(&self) -> String {
        self.numerics.clone()
    }

    async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        self.chat_many(std::slice::from_ref(req))
            .await
            .into_iter()
            .next()
            .unwrap_or_else(|| Err(LlmError::WorkerGone("no answer".into())))
    }

    async fn chat_many(&self, reqs: &[ChatRequest]) -> Vec<Result<ChatResponse, LlmError>> {
        let (reply, rx) = oneshot::channel();
        let sent = self.send(Job::Chat {
            reqs: reqs.to_vec(),
            reply,
        });
        let out = match sent {
            Ok(()) => rx.await.unwrap_or_else(|_| {
                reqs.iter()
                    .map(|_| Err(LlmError::WorkerGone("the worker dropped a chat job".into())))
                    .collect()
            }),
            Err(e) => {
                let m = e.to_string();
                reqs.iter()
                    .map(|_| Err(LlmError::WorkerGone(m.clone())))
                    .collect()
            }
        };
        for r in out.iter().flatten() {
            self.add_usage(r.usage);
        }
        out
    }

    async fn score_tool_choice(
        &self,
        req: &ChatRequest,
        candidates: &[String],
    ) -> Result<Option<Vec<f64>>, LlmError> {
        self.score_many(std::slice::from_ref(req), candidates)
            .await
            .into_iter()
            .next()
            .unwrap_or_else(|| Err(LlmError::WorkerGone("no answer".into())))
    }

    async fn score_many(
        &self,
        reqs: &[ChatRequest],
        candidates: &[String],
    ) -> Vec<Result<Option<Vec<f64>>, LlmError>> {
        self.score_first_moves(reqs, candidates)
            .await
            .into_iter()
            .map(|r| r.map(|m| m.map(|m| m.given_call)))
            .collect()
    }

    async fn score_first_moves(
        &self,
        reqs: &[ChatRequest],
        candidates: &[String],
    ) -> Vec<Result<Option<FirstMove>, LlmError>> {
        let (reply, rx) = oneshot::channel();
        let sent = self.send(Job::Score {
            reqs: reqs.to_vec(),
            candidates: candidates.to_vec(),
            reply,
        });
        match sent {
            Ok(()) => match rx.await {
                Ok(v) => v.into_iter().map(|r| r.map(Some)).collect(),
                Err(_) => reqs
                    .iter()
                    .map(|_| {
                        Err(LlmError::WorkerGone(
                            "the worker dropped a scoring job".into(),
                        ))
                    })
                    .collect(),
            },
            Err(e) => {
                let m = e.to_string();
                reqs.iter()
                    .map(|_| Err(LlmError::WorkerGone(m.clone())))
                    .collect()
            }
        }
    }

    fn usage_total(&self) -> Usage {
        self.usage.lock().map(|u| *u).unwrap_or_default()
    }
}

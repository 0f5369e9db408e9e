//! The worker that owns the llama.cpp model and context on one OS thread (`LlamaContext` is not `Send`),
//! serving jobs that arrive over a channel.
//!
//! KV-cache layout. The context has one unified KV cache shared by up to `N_SEQ` sequences:
//! - sequence 0 holds the *prefix cache*: the tokens of the last prompt (or of the prefix shared by the
//!   last group of prompts). A new prompt reuses the longest common token prefix and decodes only the rest,
//!   so a suite of tasks with the same system text and tool list pays for that prefix once;
//! - sequences `1..=N_SLOTS` are *session slots*, one per conversation being generated. A slot keeps its
//!   conversation's tokens (prompt and everything generated) after the reply, so the conversation's next
//!   turn, which repeats all of that and adds a tool result, decodes only the tool result. A scored prompt
//!   is also kept in a slot, so the chat turn that follows scoring starts from it. At the start of each
//!   job, slots that none of its prompts continues are dropped: every decode attends over all occupied
//!   cells, so stale ones would slow every later token. (Two callers interleaving jobs on one model lose
//!   the reuse, not correctness.);
//! - the sequences after the slots are scratch for scoring, one per candidate tool name, each a copy of
//!   sequence 0, cleared after the job.
//!
//! The engine's work is split by job: the KV cache's sequences (`cache`), exact scoring (`score`), token sampling
//! and the tool-call grammar (`sampling`), and generation (`generate`).

mod cache;
mod generate;
mod sampling;
mod score;

use super::LocalStats;
use super::template::ChatTemplate;
use crate::{ChatRequest, ChatResponse, FirstMove, LlmError};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use std::collections::HashMap;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// Session slots (sequences `1..=N_SLOTS`).
pub(crate) const N_SLOTS: usize = 16;
/// Scratch sequences for scoring candidates, after the slots.
const N_SCRATCH: usize = 16;
/// Sequences in the context: the prefix cache, the session slots and the scoring scratch.
pub(crate) const N_SEQ: usize = 1 + N_SLOTS + N_SCRATCH;

/// What the async side asks of the worker.
pub(crate) enum Job {
    /// Chat completions, decoded in parallel groups.
    Chat {
        reqs: Vec<ChatRequest>,
        reply: oneshot::Sender<Vec<Result<ChatResponse, LlmError>>>,
    },
    /// Exact tool-choice scores for each request.
    Score {
        reqs: Vec<ChatRequest>,
        candidates: Vec<String>,
        reply: oneshot::Sender<Vec<Result<FirstMove, LlmError>>>,
    },
    /// Switch prefix reuse on or off (the benchmark measures both) and drop the prefix cache.
    SetPrefixReuse {
        on: bool,
        reply: oneshot::Sender<()>,
    },
    /// Drops the kept KV cache, as if nothing had been decoded since loading.
    DropCache { reply: oneshot::Sender<()> },
}

/// One logits row (a score per vocabulary token).
type Row = Vec<f32>;

/// Text appended to the rendered prompt to reach the point where Qwen writes the tool name.
pub(crate) const NAME_PREFIX: &str = "<tool_call>\n{\"name\": \"";

pub(crate) struct Engine<'m> {
    model: &'m LlamaModel,
    ctx: LlamaContext<'m>,
    batch: LlamaBatch<'static>,
    template: ChatTemplate,
    name: String,
    /// Tokens whose KV entries are in sequence 0, at positions `0..cache.len()`.
    cache: Vec<LlamaToken>,
    tool_call_open: Option<LlamaToken>,
    im_end: Option<LlamaToken>,
    /// Every token whose text starts with `"`: any of them ends a JSON string.
    quote_tokens: Vec<LlamaToken>,
    /// Every token that, as the first of a reply, starts a tool call.
    call_start_tokens: Vec<LlamaToken>,
    n_ctx: usize,
    n_batch: usize,
    n_parallel: usize,
    prefix_reuse: bool,
    stats: Arc<Mutex<LocalStats>>,
    grammars: HashMap<String, String>,
    /// Tokens whose KV entries are in each session slot (slot `i` is sequence `i + 1`), at positions
    /// `0..len`. Empty = free.
    slots: Vec<Vec<LlamaToken>>,
    /// The job that last used each slot.
    slot_used: Vec<u64>,
    /// Jobs served so far.
    jobs: u64,
    /// Tool calls generated so far: numbers the calls' ids, so no two calls of one conversation share one.
    calls_made: u64,
}

/// One token to decode.
struct Entry {
    token: LlamaToken,
    pos: usize,
    seq: usize,
    logits: bool,
}

/// Decodes `entries` in chunks of `n_batch`, calling `on_logits(ctx, entry_index, batch_index)` right
/// after the chunk holding each entry that asked for logits (logits live only until the next decode).
fn decode_entries(
    ctx: &mut LlamaContext<'_>,
    batch: &mut LlamaBatch<'_>,
    n_batch: usize,
    entries: &[Entry],
    mut on_logits: impl FnMut(&LlamaContext<'_>, usize, i32) -> Result<(), LlmError>,
    model: &str,
) -> Result<(), LlmError> {
    let err = |m: String| LlmError::Local {
        model: model.to_string(),
        message: m,
    };
    for (c, chunk) in entries.chunks(n_batch).enumerate() {
        batch.clear();
        for e in chunk {
            batch
                .add(e.token, e.pos as i32, &[e.seq as i32], e.logits)
                .map_err(|x| err(format!("adding a token to the batch: {x}")))?;
        }
        ctx.decode(batch)
            .map_err(|x| err(format!("decoding {} tokens: {x}", chunk.len())))?;
        for (k, e) in chunk.iter().enumerate() {
            if e.logits {
                on_logits(ctx, c * n_batch + k, k as i32)?;
            }
        }
    }
    Ok(())
}

fn common_prefix(a: &[LlamaToken], b: &[LlamaToken]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl<'m> Engine<'m> {
    pub(crate) fn new(
        model: &'m LlamaModel,
        ctx: LlamaContext<'m>,
        template: ChatTemplate,
        name: String,
        n_parallel: usize,
        prefix_reuse: bool,
        stats: Arc<Mutex<LocalStats>>,
    ) -> Self {
        let vocab = model.vocab();
        let open = vocab.tokenize(b"<tool_call>", false, true);
        let tool_call_open = (open.len() == 1).then(|| open[0]);
        let end = vocab.tokenize(b"<|im_end|>", false, true);
        let im_end = (end.len() == 1).then(|| end[0]);
        let quote_tokens: Vec<LlamaToken> = vocab
            .tokens()
            .filter(|&t| {
                !vocab.is_control(t) && vocab.token_to_piece(t, false, None).first() == Some(&b'"')
            })
            .collect();
        // What the host takes for the start of a tool call when it is the reply's first token (`starts_call`):
        // `<tool_call>`, or a piece that opens a code fence or a JSON object.
        let call_start_tokens: Vec<LlamaToken> = vocab
            .tokens()
            .filter(|&t| {
                Some(t) == tool_call_open
                    || (!vocab.is_control(t) && {
                        let piece = vocab.token_to_piece(t, false, None);
                        let p = String::from_utf8_lossy(&piece);
                        let p = p.trim_start();
                        p.starts_with("```") || p.starts_with('{')
                    })
            })
            .collect();
        let n_ctx = ctx.n_ctx() as usize;
        let n_batch = ctx.n_batch() as usize;
        Engine {
            call_start_tokens,
            model,
            ctx,
            batch: LlamaBatch::new(n_batch, 1),
            template,
            name,
            cache: Vec::new(),
            tool_call_open,
            im_end,
            quote_tokens,
            n_ctx,
            n_batch,
            n_parallel: n_parallel.clamp(1, N_SLOTS),
            prefix_reuse,
            stats,
            grammars: HashMap::new(),
            slots: vec![Vec::new(); N_SLOTS],
            slot_used: vec![0; N_SLOTS],
            jobs: 0,
            calls_made: 0,
        }
    }

    /// Serves jobs until the channel closes (the `LocalModel` was dropped).
    pub(crate) fn run(mut self, rx: Receiver<Job>) {
        while let Ok(job) = rx.recv() {
            self.jobs += 1;
            match job {
                Job::Chat { reqs, reply } => {
                    let out = self.chat_many(&reqs);
                    let _ = reply.send(out);
                }
                Job::Score {
                    reqs,
                    candidates,
                    reply,
                } => {
                    if let Err(e) = self.drop_stale_slots(&[]) {
                        tracing::warn!("{e}");
                        self.reset();
                    }
                    let out = reqs.iter().map(|r| self.score(r, &candidates)).collect();
                    let _ = reply.send(out);
                }
                Job::SetPrefixReuse { on, reply } => {
                    self.prefix_reuse = on;
                    self.reset();
                    let _ = reply.send(());
                }
                Job::DropCache { reply } => {
                    self.reset();
                    let _ = reply.send(());
                }
            }
        }
    }

    fn err(&self, message: impl Into<String>) -> LlmError {
        LlmError::Local {
            model: self.name.clone(),
            message: message.into(),
        }
    }

    /// Forgets every sequence, after an error or when asked: the cache is rebuilt by the next prompt.
    fn reset(&mut self) {
        self.ctx.clear_kv_cache();
        self.cache.clear();
        for s in &mut self.slots {
            s.clear();
        }
    }

    fn tokenize(&self, text: &str, whole_prompt: bool) -> Vec<LlamaToken> {
        self.model
            .vocab()
            .tokenize(text.as_bytes(), whole_prompt, true)
    }

    fn piece(&self, t: LlamaToken) -> Vec<u8> {
        self.model.vocab().token_to_piece(t, false, None)
    }
}

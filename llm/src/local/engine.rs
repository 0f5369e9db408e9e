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

use super::LocalStats;
use super::grammar::tool_call_schema;
use super::template::ChatTemplate;
use crate::{ChatRequest, ChatResponse, FinishReason, FirstMove, LlmError, ToolChoice};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use llama_cpp_2::token::logit_bias::LlamaLogitBias;
use std::collections::HashMap;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::oneshot;
use tooltune_core::{ToolCall, Usage};

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

/// log(sum(exp(row))) in f64, over all of `row` or over `subset`.
fn logsumexp(row: &[f32], subset: Option<&[LlamaToken]>) -> f64 {
    let vals: Box<dyn Iterator<Item = f64>> = match subset {
        Some(s) => Box::new(s.iter().map(|t| f64::from(row[t.0 as usize]))),
        None => Box::new(row.iter().map(|&x| f64::from(x))),
    };
    let v: Vec<f64> = vals.collect();
    let m = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !m.is_finite() {
        return m;
    }
    m + v.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
}

fn common_prefix(a: &[LlamaToken], b: &[LlamaToken]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[derive(PartialEq)]
enum Mode {
    Free,
    Call,
}

/// Picks the next token, optionally under a grammar.
///
/// Checking the grammar against all 151k vocabulary entries at every step is slow (about half a second per
/// token on two busy cores), so, as llama.cpp's own common sampler does, the token is first chosen without
/// the grammar and checked alone; only when the grammar rejects it is the choice repeated over the
/// grammar-filtered vocabulary. For greedy decoding the result is the same as filtering first.
struct TokenSampler {
    base: LlamaSampler,
    grammar: Option<LlamaSampler>,
}

impl TokenSampler {
    fn sample(&mut self, ctx: &LlamaContext<'_>, idx: i32) -> LlamaToken {
        let t = self.base.sample(ctx, idx);
        let Some(g) = self.grammar.as_mut() else {
            return t;
        };
        let logit = ctx.get_logits_ith(idx)[t.0 as usize];
        let mut one = LlamaTokenDataArray::new(vec![LlamaTokenData::new(t, logit, 0.0)], false);
        one.apply_sampler(g);
        let t = if one.data[0].logit().is_finite() {
            t
        } else {
            let mut all = ctx.token_data_array_ith(idx);
            all.apply_sampler(g);
            all.apply_sampler(&mut self.base);
            all.selected_token().unwrap_or(t)
        };
        g.accept(t);
        t
    }
}

/// One request being generated.
struct SeqState {
    seq: usize,
    /// The session slot (`seq - 1`), whose token list grows with every token fed.
    slot: usize,
    pos: usize,
    prompt_len: usize,
    sampler: TokenSampler,
    mode: Mode,
    grammar: Option<String>,
    required: bool,
    forbid_calls: bool,
    temperature: f32,
    seed: u32,
    text: Vec<u8>,
    call: Vec<u8>,
    calls: Vec<ToolCall>,
    generated: u32,
    max_tokens: u32,
    next: Option<LlamaToken>,
    done: Option<Result<FinishReason, LlmError>>,
}

/// A request turned into tokens.
struct Prepared {
    tokens: Vec<LlamaToken>,
    grammar: Option<String>,
    required: bool,
    /// Tools are in the prompt but must not be called: the tool-call token is banned.
    forbid_calls: bool,
    max_tokens: u32,
    temperature: f32,
    seed: u32,
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

    /// Clears the first `n` scoring scratch sequences.
    fn clear_scratch(&mut self, n: usize) -> Result<(), LlmError> {
        for s in N_SLOTS + 1..=N_SLOTS + n {
            self.ctx
                .clear_kv_cache_seq(Some(s as u32), None, None)
                .map_err(|e| self.err(format!("clearing sequence {s}: {e}")))?;
        }
        Ok(())
    }

    /// How many leading tokens of `tokens` slot `i` already holds, leaving at least the last token to decode
    /// (its logits are needed).
    fn slot_reuse(&self, i: usize, tokens: &[LlamaToken]) -> usize {
        if !self.prefix_reuse {
            return 0;
        }
        common_prefix(&self.slots[i], tokens).min(tokens.len().saturating_sub(1))
    }

    fn free_slot(&mut self, i: usize) -> Result<(), LlmError> {
        if !self.slots[i].is_empty() {
            self.ctx
                .clear_kv_cache_seq(Some(i as u32 + 1), None, None)
                .map_err(|e| self.err(format!("clearing slot {}: {e}", i + 1)))?;
            self.slots[i].clear();
        }
        Ok(())
    }

    /// Drops the slots that none of `prompts` continues beyond what sequence 0 or the other prompts would
    /// give it anyway.
    fn drop_stale_slots(&mut self, prompts: &[&[LlamaToken]]) -> Result<(), LlmError> {
        let base: Vec<usize> = prompts
            .iter()
            .enumerate()
            .map(|(k, p)| {
                let with_others = prompts
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != k)
                    .map(|(_, q)| common_prefix(p, q))
                    .chain(std::iter::once(common_prefix(p, &self.cache)))
                    .max()
                    .unwrap_or(0);
                self.boundary_at_or_below(p, with_others)
            })
            .collect();
        for i in 0..N_SLOTS {
            if self.slots[i].is_empty() {
                continue;
            }
            let wanted = prompts
                .iter()
                .zip(&base)
                .any(|(p, &b)| self.slot_reuse(i, p) > b);
            if !wanted {
                self.free_slot(i)?;
            }
        }
        Ok(())
    }

    /// The free slot (not in `taken`) holding most of `tokens`, trimmed to that much, when it holds at
    /// least `at_least` tokens. Returns the slot and how many tokens of `tokens` it holds.
    fn continue_slot(
        &mut self,
        tokens: &[LlamaToken],
        at_least: usize,
        taken: &mut [bool],
    ) -> Result<Option<(usize, usize)>, LlmError> {
        let best = (0..N_SLOTS)
            .filter(|&i| !taken[i])
            .map(|i| (self.slot_reuse(i, tokens), i))
            .max_by_key(|&(reuse, i)| (reuse, std::cmp::Reverse(i)));
        let Some((reuse, i)) = best.filter(|&(reuse, _)| reuse > 0 && reuse >= at_least) else {
            return Ok(None);
        };
        if tracing::enabled!(tracing::Level::TRACE) {
            let show = |t: &[LlamaToken]| {
                t.iter()
                    .map(|&x| format!("{:?}", String::from_utf8_lossy(&self.piece(x))))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            let a = reuse.saturating_sub(2);
            tracing::trace!(
                held = show(&self.slots[i][a..(reuse + 8).min(self.slots[i].len())]),
                prompt = show(&tokens[a..(reuse + 8).min(tokens.len())]),
                "where a prompt leaves its slot",
            );
        }
        self.ctx
            .clear_kv_cache_seq(Some(i as u32 + 1), Some(reuse as u32), None)
            .map_err(|e| self.err(format!("trimming slot {}: {e}", i + 1)))?;
        self.slots[i].truncate(reuse);
        taken[i] = true;
        self.slot_used[i] = self.jobs;
        Ok(Some((i, reuse)))
    }

    /// A fresh slot (free, else the least recently used not in `taken`) holding a copy of the first `shared`
    /// tokens of sequence 0, which must be `tokens[..shared]`.
    fn fresh_slot(
        &mut self,
        tokens: &[LlamaToken],
        shared: usize,
        taken: &mut [bool],
    ) -> Result<usize, LlmError> {
        let i = (0..N_SLOTS)
            .filter(|&i| !taken[i])
            .min_by_key(|&i| (!self.slots[i].is_empty(), self.slot_used[i], i))
            .ok_or_else(|| self.err("no free session slot"))?;
        self.free_slot(i)?;
        if shared > 0 {
            self.ctx
                .copy_kv_cache_seq(0, i as i32 + 1, Some(0), Some(shared as u32))
                .map_err(|e| self.err(format!("copying the prefix to slot {}: {e}", i + 1)))?;
        }
        self.slots[i] = tokens[..shared].to_vec();
        taken[i] = true;
        self.slot_used[i] = self.jobs;
        Ok(i)
    }

    fn tokenize(&self, text: &str, whole_prompt: bool) -> Vec<LlamaToken> {
        self.model
            .vocab()
            .tokenize(text.as_bytes(), whole_prompt, true)
    }

    /// Whether sampling `t` after free text `so_far` begins a tool call: the `<tool_call>` token, or a code
    /// fence or `{` at the start of the reply, or a code fence at the start of a line.
    fn starts_call(&self, t: LlamaToken, so_far: &[u8]) -> bool {
        if self.tool_call_open.is_none() {
            return false;
        }
        if Some(t) == self.tool_call_open {
            return true;
        }
        let piece = self.piece(t);
        let piece = String::from_utf8_lossy(&piece);
        let at_start = so_far.iter().all(u8::is_ascii_whitespace);
        let at_line_start = at_start || so_far.ends_with(b"\n");
        let p = piece.trim_start();
        (at_line_start && p.starts_with("```")) || (at_start && p.starts_with('{'))
    }

    fn piece(&self, t: LlamaToken) -> Vec<u8> {
        self.model.vocab().token_to_piece(t, false, None)
    }

    /// Positions where a message ends (just after each `<|im_end|>`), in order, with 0 first. Prompts are
    /// always decoded in segments cut at these positions, and cached prefixes are reused only up to one of
    /// them. llama.cpp's numerics depend a little on how tokens are split into batches (batched matrix
    /// kernels differ from single-row ones), so a fixed, content-defined split is what makes a score
    /// identical whether or not the prefix came from the cache.
    fn boundaries(&self, tokens: &[LlamaToken]) -> Vec<usize> {
        let mut b = vec![0];
        if let Some(end) = self.im_end {
            b.extend(
                tokens
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| **t == end)
                    .map(|(i, _)| i + 1),
            );
        }
        b
    }

    /// The largest message boundary of `tokens` at or below `limit`.
    fn boundary_at_or_below(&self, tokens: &[LlamaToken], limit: usize) -> usize {
        self.boundaries(tokens)
            .into_iter()
            .filter(|&b| b <= limit)
            .max()
            .unwrap_or(0)
    }

    /// Brings sequence 0 to exactly `tokens`, reusing the cached prefix up to the last message boundary it
    /// shares with them. With `want_logits`, the last segment is always decoded and the logits row of the
    /// last token is returned, and also the row at `also_at` when that position lies after the last message
    /// boundary (it is then in the last segment, which is always decoded).
    fn sync_seq0(
        &mut self,
        tokens: &[LlamaToken],
        want_logits: bool,
        also_at: Option<usize>,
    ) -> Result<(Option<Row>, Option<Row>), LlmError> {
        let bounds = self.boundaries(tokens);
        let shared = if self.prefix_reuse {
            common_prefix(&self.cache, tokens)
        } else {
            0
        };
        let limit = if want_logits {
            shared.min(tokens.len().saturating_sub(1))
        } else {
            shared
        };
        let keep = if limit == tokens.len() && !want_logits {
            limit
        } else {
            bounds
                .iter()
                .copied()
                .filter(|&b| b <= limit)
                .max()
                .unwrap_or(0)
        };
        self.ctx
            .clear_kv_cache_seq(Some(0), Some(keep as u32), None)
            .map_err(|e| self.err(format!("trimming the prefix cache: {e}")))?;
        self.cache.truncate(keep);
        let started = Instant::now();
        let mut row = None;
        let mut also_row = None;
        // Segment ends after `keep`: each message boundary, then the end of the prompt.
        let mut cuts: Vec<usize> = bounds
            .into_iter()
            .filter(|&b| b > keep && b < tokens.len())
            .collect();
        cuts.push(tokens.len());
        let mut from = keep;
        for to in cuts {
            if to <= from {
                continue;
            }
            let entries: Vec<Entry> = (from..to)
                .map(|pos| Entry {
                    token: tokens[pos],
                    pos,
                    seq: 0,
                    logits: want_logits && (pos + 1 == tokens.len() || Some(pos) == also_at),
                })
                .collect();
            decode_entries(
                &mut self.ctx,
                &mut self.batch,
                self.n_batch,
                &entries,
                |ctx, e, idx| {
                    let r = ctx.get_logits_ith(idx).to_vec();
                    if entries[e].pos + 1 == tokens.len() {
                        row = Some(r);
                    } else {
                        also_row = Some(r);
                    }
                    Ok(())
                },
                &self.name,
            )?;
            self.cache.extend_from_slice(&tokens[from..to]);
            from = to;
        }
        if let Ok(mut s) = self.stats.lock() {
            // A chat group's shared prefix is counted per request by `run_group`.
            if want_logits {
                s.prompt_tokens_reused += keep as u64;
            }
            s.prompt_tokens_decoded += (tokens.len() - keep) as u64;
            s.prefill_seconds += started.elapsed().as_secs_f64();
        }
        Ok((row, also_row))
    }

    /// Exact first-move probabilities; see [`crate::local`] for what is scored.
    fn score(&mut self, req: &ChatRequest, candidates: &[String]) -> Result<FirstMove, LlmError> {
        let r = self.score_inner(req, candidates);
        if r.is_err() {
            self.reset();
        }
        r
    }

    fn score_inner(
        &mut self,
        req: &ChatRequest,
        candidates: &[String],
    ) -> Result<FirstMove, LlmError> {
        if candidates.is_empty() {
            return Err(LlmError::InvalidRequest(
                "scoring needs at least one candidate".into(),
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for c in candidates {
            if c.is_empty() || !seen.insert(c) {
                return Err(LlmError::InvalidRequest(format!(
                    "candidate names must be non-empty and distinct (`{c}`)"
                )));
            }
        }
        let prompt = self.template.render(&req.messages, &req.tools, true)?;
        let prompt_tokens = self.tokenize(&prompt, true);
        let tokens = self.tokenize(&(prompt + NAME_PREFIX), true);
        // The logits after the prompt itself say whether the first token opens a tool call. Only usable when the
        // prompt's tokens are a prefix of the scored text's (they are: `<tool_call>` is a special token, so the
        // tokeniser cannot merge across it; checked rather than assumed).
        let decide_at = (!prompt_tokens.is_empty()
            && prompt_tokens.len() < tokens.len()
            && tokens.starts_with(&prompt_tokens))
        .then(|| prompt_tokens.len() - 1);
        let cands: Vec<Vec<LlamaToken>> = candidates
            .iter()
            .map(|c| self.model.vocab().tokenize(c.as_bytes(), false, false))
            .collect();
        let n = tokens.len();
        let need = n + cands.iter().map(Vec::len).sum::<usize>();
        if need > self.n_ctx {
            return Err(LlmError::ContextOverflow {
                tokens: need,
                n_ctx: self.n_ctx,
            });
        }
        let started = Instant::now();
        let (row, decide_row) = self.sync_seq0(&tokens, true, decide_at)?;
        let row = row.ok_or_else(|| self.err("the prompt produced no logits"))?;
        let p_call = match decide_row {
            Some(r) => {
                let lse = logsumexp(&r, None);
                (logsumexp(&r, Some(&self.call_start_tokens)) - lse)
                    .exp()
                    .clamp(0.0, 1.0)
            }
            None => {
                return Err(self.err(
                    "the prompt's tokens are not a prefix of the scored text's; cannot score the first move",
                ));
            }
        };
        let lse0 = logsumexp(&row, None);
        let mut lp: Vec<f64> = cands
            .iter()
            .map(|c| f64::from(row[c[0].0 as usize]) - lse0)
            .collect();
        let quotes = std::mem::take(&mut self.quote_tokens);
        let order: Vec<usize> = (0..cands.len()).collect();
        let mut result = Ok(());
        for group in order.chunks(N_SCRATCH) {
            let mut entries = Vec::new();
            let mut owner = Vec::new();
            for (j, &ci) in group.iter().enumerate() {
                let seq = N_SLOTS + 1 + j;
                self.ctx
                    .copy_kv_cache_seq(0, seq as i32, Some(0), Some(n as u32))
                    .map_err(|e| self.err(format!("copying the prompt to sequence {seq}: {e}")))?;
                for (k, &token) in cands[ci].iter().enumerate() {
                    entries.push(Entry {
                        token,
                        pos: n + k,
                        seq,
                        logits: true,
                    });
                    owner.push((ci, k));
                }
            }
            result = decode_entries(
                &mut self.ctx,
                &mut self.batch,
                self.n_batch,
                &entries,
                |ctx, e, idx| {
                    let (ci, k) = owner[e];
                    let row = ctx.get_logits_ith(idx);
                    let lse = logsumexp(row, None);
                    lp[ci] += match cands[ci].get(k + 1) {
                        Some(next) => f64::from(row[next.0 as usize]) - lse,
                        // The name ends here: the next token is one that starts with the closing quote.
                        None => logsumexp(row, Some(&quotes)) - lse,
                    };
                    Ok(())
                },
                &self.name,
            );
            self.clear_scratch(group.len())?;
            if result.is_err() {
                break;
            }
        }
        self.quote_tokens = quotes;
        result?;
        // The chat turn that usually follows (the same prompt, without the name prefix) starts from here.
        if self.prefix_reuse {
            self.fresh_slot(&tokens, n, &mut [false; N_SLOTS])?;
        }
        if let Ok(mut s) = self.stats.lock() {
            s.scoring_calls += 1;
            s.scoring_seconds += started.elapsed().as_secs_f64();
        }
        let m = lp.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = lp.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum();
        Ok(FirstMove {
            given_call: e.into_iter().map(|x| x / z).collect(),
            p_call,
        })
    }

    fn grammar_for(&mut self, req: &ChatRequest) -> Result<String, LlmError> {
        let key = serde_json::to_string(&req.tools).unwrap_or_default();
        if let Some(g) = self.grammars.get(&key) {
            return Ok(g.clone());
        }
        let usable =
            |s: &serde_json::Value| llama_cpp_2::json_schema_to_grammar(&s.to_string()).is_ok();
        let schema = tool_call_schema(&req.tools, usable);
        let g = llama_cpp_2::json_schema_to_grammar(&schema.to_string()).map_err(|e| {
            LlmError::InvalidRequest(format!(
                "the tools' schemas cannot be turned into a grammar ({e}); tools: {}",
                req.tools
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
        self.grammars.insert(key, g.clone());
        Ok(g)
    }

    fn prepare(&mut self, req: &ChatRequest) -> Result<Prepared, LlmError> {
        // With `ToolChoice::None` the tools stay in the prompt, as hosted APIs keep them: the conversation
        // the model sees does not change under it, and the prompt still continues the cached earlier turns.
        // Calls are then ruled out at sampling (see `forbid_calls`).
        let use_tools = !req.tools.is_empty() && req.tool_choice != ToolChoice::None;
        let mut text = self.template.render(&req.messages, &req.tools, true)?;
        let required = use_tools && req.tool_choice == ToolChoice::Required;
        if required {
            text.push_str("<tool_call>\n");
        }
        let grammar = if use_tools {
            Some(self.grammar_for(req)?)
        } else {
            None
        };
        let tokens = self.tokenize(&text, true);
        if tokens.len() + 1 > self.n_ctx {
            return Err(LlmError::ContextOverflow {
                tokens: tokens.len() + 1,
                n_ctx: self.n_ctx,
            });
        }
        Ok(Prepared {
            tokens,
            grammar,
            required,
            forbid_calls: !req.tools.is_empty() && !use_tools,
            max_tokens: req.max_tokens.max(1),
            temperature: req.temperature,
            seed: req.seed.unwrap_or(0) as u32,
        })
    }

    fn sampler(
        &self,
        grammar: Option<&str>,
        temperature: f32,
        seed: u32,
        forbid_calls: bool,
    ) -> Result<TokenSampler, LlmError> {
        let grammar = match grammar {
            Some(g) => Some(
                LlamaSampler::grammar(self.model, g, "root")
                    .map_err(|e| self.err(format!("compiling the tool-call grammar: {e}")))?,
            ),
            None => None,
        };
        let mut chain = Vec::new();
        if forbid_calls && let Some(open) = self.tool_call_open {
            chain.push(LlamaSampler::logit_bias(
                self.model.n_vocab(),
                &[LlamaLogitBias::new(open, f32::NEG_INFINITY)],
            ));
        }
        if temperature > 0.0 {
            chain.push(LlamaSampler::temp(temperature));
            chain.push(LlamaSampler::dist(seed));
        } else {
            chain.push(LlamaSampler::greedy());
        }
        let base = LlamaSampler::chain_simple(chain);
        Ok(TokenSampler { base, grammar })
    }

    fn chat_many(&mut self, reqs: &[ChatRequest]) -> Vec<Result<ChatResponse, LlmError>> {
        let mut out: Vec<Option<Result<ChatResponse, LlmError>>> =
            (0..reqs.len()).map(|_| None).collect();
        let mut ready: Vec<(usize, Prepared)> = Vec::new();
        for (i, r) in reqs.iter().enumerate() {
            match self.prepare(r) {
                Ok(p) => ready.push((i, p)),
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        let prompts: Vec<&[LlamaToken]> = ready.iter().map(|(_, p)| p.tokens.as_slice()).collect();
        if let Err(e) = self.drop_stale_slots(&prompts) {
            tracing::warn!("{e}");
            self.reset();
        }
        // Groups share the KV cache: keep each group's worst case (prompts plus all generated tokens)
        // inside the context.
        let mut start = 0;
        while start < ready.len() {
            let mut end = start;
            let mut budget = 0usize;
            while end < ready.len() && end - start < self.n_parallel {
                let p = &ready[end].1;
                let cost = p.tokens.len() + p.max_tokens as usize + 8;
                if end > start && budget + cost > self.n_ctx {
                    break;
                }
                budget += cost;
                end += 1;
            }
            let group = &ready[start..end];
            match self.run_group(group) {
                Ok(results) => {
                    for ((i, _), r) in group.iter().zip(results) {
                        out[*i] = Some(r);
                    }
                }
                Err(e) => {
                    let msg = e.to_string();
                    self.reset();
                    for (i, _) in group {
                        out[*i] = Some(Err(self.err(msg.clone())));
                    }
                }
            }
            start = end;
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(self.err("request was not processed"))))
            .collect()
    }

    /// Generates replies for a group of requests as parallel sequences of one batch.
    fn run_group(
        &mut self,
        group: &[(usize, Prepared)],
    ) -> Result<Vec<Result<ChatResponse, LlmError>>, LlmError> {
        // Requests that continue a conversation kept in a slot start from it, when it holds at least what
        // sequence 0 would give them without decoding anything.
        let mut taken = [false; N_SLOTS];
        let mut plan: Vec<Option<(usize, usize)>> = Vec::with_capacity(group.len());
        for (_, p) in group {
            let in_seq0 = if self.prefix_reuse {
                let c = common_prefix(&self.cache, &p.tokens).min(p.tokens.len().saturating_sub(1));
                self.boundary_at_or_below(&p.tokens, c)
            } else {
                0
            };
            plan.push(self.continue_slot(&p.tokens, in_seq0, &mut taken)?);
        }
        // The others start from sequence 0, brought to the longest prefix they share at a message boundary.
        let rest: Vec<usize> = (0..group.len()).filter(|&j| plan[j].is_none()).collect();
        if let Some(&first) = rest.first() {
            let first_tokens = &group[first].1.tokens;
            let mut shared = rest
                .iter()
                .map(|&j| {
                    let t = &group[j].1.tokens;
                    common_prefix(first_tokens, t).min(t.len().saturating_sub(1))
                })
                .min()
                .unwrap_or(0);
            shared = self.boundary_at_or_below(first_tokens, shared);
            self.sync_seq0(&first_tokens[..shared], false, None)?;
            for &j in &rest {
                let slot = self.fresh_slot(&group[j].1.tokens, shared, &mut taken)?;
                plan[j] = Some((slot, shared));
            }
        }

        let mut states = Vec::with_capacity(group.len());
        let mut entries = Vec::new();
        let mut state_of_entry = Vec::new();
        let mut reused = 0u64;
        for (j, (_, p)) in group.iter().enumerate() {
            let (slot, from) = plan[j].ok_or_else(|| self.err("a request got no slot"))?;
            let seq = slot + 1;
            reused += from as u64;
            tracing::debug!(slot, from, len = p.tokens.len(), "chat prompt");
            for (k, &token) in p.tokens[from..].iter().enumerate() {
                entries.push(Entry {
                    token,
                    pos: from + k,
                    seq,
                    logits: from + k + 1 == p.tokens.len(),
                });
                state_of_entry.push(j);
            }
            self.slots[slot].extend_from_slice(&p.tokens[from..]);
            let mode = if p.required { Mode::Call } else { Mode::Free };
            let g = if p.required {
                p.grammar.as_deref()
            } else {
                None
            };
            states.push(SeqState {
                seq,
                slot,
                pos: p.tokens.len(),
                prompt_len: p.tokens.len(),
                sampler: self.sampler(g, p.temperature, p.seed, p.forbid_calls)?,
                mode,
                grammar: p.grammar.clone(),
                forbid_calls: p.forbid_calls,
                required: p.required,
                temperature: p.temperature,
                seed: p.seed,
                text: Vec::new(),
                call: Vec::new(),
                calls: Vec::new(),
                generated: 0,
                max_tokens: p.max_tokens,
                next: None,
                done: None,
            });
        }
        let started = Instant::now();
        decode_entries(
            &mut self.ctx,
            &mut self.batch,
            self.n_batch,
            &entries,
            |ctx, e, idx| {
                let st = &mut states[state_of_entry[e]];
                st.next = Some(st.sampler.sample(ctx, idx));
                Ok(())
            },
            &self.name,
        )?;
        let suffix_tokens = entries.len();
        if let Ok(mut s) = self.stats.lock() {
            s.prompt_tokens_reused += reused;
            s.prompt_tokens_decoded += suffix_tokens as u64;
            s.prefill_seconds += started.elapsed().as_secs_f64();
        }

        let started = Instant::now();
        let nl_close = self.tokenize("\n</tool_call>", false);
        let nl = self.tokenize("\n", false);
        let mut generated_total = 0u64;
        loop {
            let mut entries = Vec::new();
            let mut state_of_entry = Vec::new();
            for (j, st) in states
                .iter_mut()
                .enumerate()
                .filter(|(_, s)| s.done.is_none())
            {
                let Some(t) = st.next.take() else {
                    st.done = Some(Ok(FinishReason::Stop));
                    continue;
                };
                st.generated += 1;
                generated_total += 1;
                let eog = self.model.vocab().is_eog(t);
                let feed: Vec<LlamaToken> = match st.mode {
                    Mode::Call if eog => {
                        // The grammar only allows end-of-generation once the call's JSON is complete.
                        self.calls_made += 1;
                        let call = parse_call(&st.call, self.calls_made);
                        st.call.clear();
                        match call {
                            Ok(c) => st.calls.push(c),
                            Err(m) => {
                                st.done = Some(Err(self.err(m)));
                                continue;
                            }
                        }
                        if st.required {
                            st.done = Some(Ok(FinishReason::ToolCalls));
                            continue;
                        }
                        st.mode = Mode::Free;
                        st.sampler =
                            self.sampler(None, st.temperature, st.seed, st.forbid_calls)?;
                        // The template writes the call as `...}}\n</tool_call>`, where the tokenizer merges
                        // the JSON's last token with the newline. Re-feeding that token merged keeps the slot
                        // token-for-token equal to the next turn's prompt, so that turn reuses it whole.
                        let last = self.slots[st.slot].last().copied();
                        match last {
                            Some(last) => {
                                let mut text = self.piece(last);
                                text.extend_from_slice(b"\n</tool_call>");
                                let merged = self.model.vocab().tokenize(&text, false, true);
                                if merged.first() == Some(&last) {
                                    nl_close.clone()
                                } else {
                                    st.pos -= 1;
                                    self.slots[st.slot].pop();
                                    self.ctx
                                        .clear_kv_cache_seq(
                                            Some(st.seq as u32),
                                            Some(st.pos as u32),
                                            None,
                                        )
                                        .map_err(|e| {
                                            self.err(format!("re-feeding the call's end: {e}"))
                                        })?;
                                    merged
                                }
                            }
                            None => nl_close.clone(),
                        }
                    }
                    Mode::Call => {
                        st.call.extend(self.piece(t));
                        vec![t]
                    }
                    Mode::Free if eog => {
                        st.done = Some(Ok(if st.calls.is_empty() {
                            FinishReason::Stop
                        } else {
                            FinishReason::ToolCalls
                        }));
                        continue;
                    }
                    Mode::Free if st.grammar.is_some() && self.starts_call(t, &st.text) => {
                        // The model is starting a tool call, either with Qwen's `<tool_call>` token or
                        // the way small models often do, as a fenced or bare JSON object. Either way
                        // the call is rewritten into the trained format and constrained by the grammar.
                        st.mode = Mode::Call;
                        st.sampler = self.sampler(
                            st.grammar.as_deref(),
                            st.temperature,
                            st.seed,
                            st.forbid_calls,
                        )?;
                        let mut f = self.tool_call_open.into_iter().collect::<Vec<_>>();
                        f.extend_from_slice(&nl);
                        f
                    }
                    Mode::Free => {
                        st.text.extend(self.piece(t));
                        vec![t]
                    }
                };
                if st.generated >= st.max_tokens || st.pos + feed.len() + 1 >= self.n_ctx {
                    st.done = Some(Ok(FinishReason::Length));
                    continue;
                }
                let last = feed.len() - 1;
                self.slots[st.slot].extend_from_slice(&feed);
                for (k, token) in feed.into_iter().enumerate() {
                    entries.push(Entry {
                        token,
                        pos: st.pos + k,
                        seq: st.seq,
                        logits: k == last,
                    });
                    state_of_entry.push(j);
                }
                st.pos += last + 1;
            }
            if entries.is_empty() {
                break;
            }
            decode_entries(
                &mut self.ctx,
                &mut self.batch,
                self.n_batch,
                &entries,
                |ctx, e, idx| {
                    let st = &mut states[state_of_entry[e]];
                    st.next = Some(st.sampler.sample(ctx, idx));
                    Ok(())
                },
                &self.name,
            )?;
        }
        if let Ok(mut s) = self.stats.lock() {
            s.generated_tokens += generated_total;
            s.generate_seconds += started.elapsed().as_secs_f64();
        }
        Ok(states
            .into_iter()
            .map(|st| {
                let finish = st.done.unwrap_or(Ok(FinishReason::Stop))?;
                let text = String::from_utf8_lossy(&st.text).trim().to_string();
                Ok(ChatResponse {
                    content: (!text.is_empty()).then_some(text),
                    tool_calls: st.calls,
                    usage: Usage {
                        prompt_tokens: st.prompt_len as u64,
                        completion_tokens: u64::from(st.generated),
                    },
                    finish_reason: finish,
                })
            })
            .collect())
    }
}

/// Parses the grammar-constrained JSON of one tool call.
fn parse_call(bytes: &[u8], number: u64) -> Result<ToolCall, String> {
    let text = String::from_utf8_lossy(bytes);
    let v: serde_json::Value = serde_json::from_str(text.trim())
        .map_err(|e| format!("tool call is not valid JSON ({e}): {text}"))?;
    let name = v
        .get("name")
        .and_then(|n| n.as_str())
        .ok_or_else(|| format!("tool call has no string `name`: {text}"))?;
    Ok(ToolCall {
        id: Some(format!("call_{number}")),
        name: name.to_string(),
        arguments: v.get("arguments").cloned().unwrap_or(serde_json::json!({})),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_call_reads_name_and_arguments() {
        let c =
            parse_call(br#"{"name": "read_file", "arguments": {"path": "a"}}"#, 2).expect("parses");
        assert_eq!(c.name, "read_file");
        assert_eq!(c.arguments["path"], "a");
        assert_eq!(c.id.as_deref(), Some("call_2"));
        assert!(parse_call(b"{\"arguments\": {}}", 0).is_err());
    }

    #[test]
    fn logsumexp_is_stable_and_exact_on_small_inputs() {
        let row = [0.0f32, 0.0, 1000.0];
        assert!((logsumexp(&row, None) - 1000.0).abs() < 1e-9);
        let two = [0.0f32, 0.0];
        assert!((logsumexp(&two, None) - 2f64.ln()).abs() < 1e-12);
        assert!((logsumexp(&row, Some(&[LlamaToken(0)])) - 0.0).abs() < 1e-12);
    }
}

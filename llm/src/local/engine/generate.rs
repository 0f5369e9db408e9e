//! Generation: requests turned into tokens, grouped so that each group fits the context, and decoded as parallel
//! sequences of one batch, each in its session slot; a tool call the model starts is rewritten into Qwen's format
//! and constrained by the grammar.

use super::sampling::TokenSampler;
use super::{Engine, Entry, N_SLOTS, common_prefix, decode_entries};
use crate::{ChatRequest, ChatResponse, FinishReason, LlmError, ToolChoice};
use llama_cpp_2::token::LlamaToken;
use std::time::Instant;
use tooltune_core::{ToolCall, Usage};

#[derive(PartialEq)]
enum Mode {
    Free,
    Call,
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
    /// The tool-call grammar, applied once a call starts.
    grammar: Option<String>,
    /// The grammar of a text reply's format, applied from the first token.
    text_grammar: Option<String>,
    required: bool,
    /// Tools are in the prompt but must not be called: the tool-call token is banned.
    forbid_calls: bool,
    max_tokens: u32,
    temperature: f32,
    seed: u32,
}

impl<'m> Engine<'m> {
    fn prepare(&mut self, req: &ChatRequest) -> Result<Prepared, LlmError> {
        // With `ToolChoice::None` the tools stay in the prompt, as hosted APIs keep them: the conversation
        // the model sees does not change under it, and the prompt still continues the cached earlier turns.
        // Calls are then ruled out at sampling (see `forbid_calls`).
        let use_tools = !req.tools.is_empty() && req.tool_choice != ToolChoice::None;
        let mut text = self.template.render(&req.messages, &req.tools, true)?;
        let required =
            use_tools && matches!(req.tool_choice, ToolChoice::Required | ToolChoice::Tool(_));
        if required {
            text.push_str("<tool_call>\n");
        }
        let grammar = match &req.tool_choice {
            _ if !use_tools => None,
            // A named tool: the prompt shows every tool, the grammar allows a call of this one only.
            ToolChoice::Tool(name) => {
                let named: Vec<_> = req
                    .tools
                    .iter()
                    .filter(|t| &t.name == name)
                    .cloned()
                    .collect();
                if named.is_empty() {
                    return Err(LlmError::InvalidRequest(format!(
                        "tool_choice names `{name}`, which is not among the request's tools"
                    )));
                }
                Some(self.grammar_for(&named)?)
            }
            _ => Some(self.grammar_for(&req.tools)?),
        };
        let text_grammar = req
            .format
            .as_ref()
            .filter(|_| !use_tools)
            .map(crate::ReplyFormat::grammar);
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
            text_grammar,
            required,
            forbid_calls: !req.tools.is_empty() && !use_tools,
            max_tokens: req.max_tokens.max(1),
            temperature: req.temperature,
            seed: req.seed.unwrap_or(0) as u32,
        })
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

    pub(super) fn chat_many(
        &mut self,
        reqs: &[ChatRequest],
    ) -> Vec<Result<ChatResponse, LlmError>> {
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
        let plan = self.plan_slots(group)?;
        let mut states = self.prefill(group, &plan)?;
        self.generate_replies(&mut states)?;
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

    /// The slot each request of a group starts from, and how many of its tokens that slot already holds.
    fn plan_slots(
        &mut self,
        group: &[(usize, Prepared)],
    ) -> Result<Vec<Option<(usize, usize)>>, LlmError> {
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
        Ok(plan)
    }

    /// Feeds each request's prompt, past what its slot holds, into its slot, and samples its first token.
    fn prefill(
        &mut self,
        group: &[(usize, Prepared)],
        plan: &[Option<(usize, usize)>],
    ) -> Result<Vec<SeqState>, LlmError> {
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
                p.text_grammar.as_deref()
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
        self.decode_and_sample(&entries, &state_of_entry, &mut states)?;
        let suffix_tokens = entries.len();
        if let Ok(mut s) = self.stats.lock() {
            s.prompt_tokens_reused += reused;
            s.prompt_tokens_decoded += suffix_tokens as u64;
            s.prefill_seconds += started.elapsed().as_secs_f64();
        }
        Ok(states)
    }

    /// Generates the replies token by token, all unfinished requests in one batch per step, until each is done.
    /// Decodes `entries` and, at each entry that asks for logits, samples the next token of the sequence it
    /// belongs to (`state_of_entry[i]`: the state of entry `i`). Prefill and each generation step end this way.
    fn decode_and_sample(
        &mut self,
        entries: &[Entry],
        state_of_entry: &[usize],
        states: &mut [SeqState],
    ) -> Result<(), LlmError> {
        decode_entries(
            &mut self.ctx,
            &mut self.batch,
            self.n_batch,
            entries,
            |ctx, e, idx| {
                let st = &mut states[state_of_entry[e]];
                st.next = Some(st.sampler.sample(ctx, idx));
                Ok(())
            },
            &self.name,
        )
    }

    fn generate_replies(&mut self, states: &mut [SeqState]) -> Result<(), LlmError> {
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
                    if st.mode == Mode::Call {
                        // The call is dropped unfinished: the reply has no call and no text.
                        tracing::debug!(
                            call = %String::from_utf8_lossy(&st.call),
                            "a tool call was cut at the token limit",
                        );
                    }
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
            self.decode_and_sample(&entries, &state_of_entry, states)?;
        }
        if let Ok(mut s) = self.stats.lock() {
            s.generated_tokens += generated_total;
            s.generate_seconds += started.elapsed().as_secs_f64();
        }
        Ok(())
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
}

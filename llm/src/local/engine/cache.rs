//! The KV cache's sequences: sequence 0, the prefix cache, brought to a prompt in segments cut at message
//! boundaries, and the session slots, kept, continued, handed out and dropped between jobs. The layout is
//! described in the engine's module documentation.

use super::{Engine, Entry, N_SLOTS, Row, common_prefix, decode_entries};
use crate::LlmError;
use llama_cpp_2::token::LlamaToken;
use std::time::Instant;

impl<'m> Engine<'m> {
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
    pub(super) fn drop_stale_slots(&mut self, prompts: &[&[LlamaToken]]) -> Result<(), LlmError> {
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
    pub(super) fn continue_slot(
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
    pub(super) fn fresh_slot(
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
    pub(super) fn boundary_at_or_below(&self, tokens: &[LlamaToken], limit: usize) -> usize {
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
    pub(super) fn sync_seq0(
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
}

//! Exact scoring of a request's first move (see the `local` module's documentation for what is scored): the
//! prompt decoded once in sequence 0, each candidate name decoded from a copy of it in a scratch sequence.
//!
//! Prompts are scored one after another, not side by side. Decoding the tails of eight prompts (what follows
//! their shared system text and tool list) in one batch, and all their candidates' names in another, was tried
//! on a MetaTool group (72 held-out requests, six tools, the 1.5B on two AVX-512 cores): 60.6 s instead of 87.8 s,
//! but a request's probabilities then depended on the batch it was decoded in (median change 0.014, largest
//! 0.068 against the same request scored alone): llama.cpp's CPU kernels do not give a token the same bits in
//! every batch, and re-quantising the activations at every layer turns a last-bit difference into a visible one
//! now and then. Scores that move with the company a task keeps would break the reproducibility that screens,
//! stored results and workers rely on, so the faster path was not kept.

use super::{Engine, Entry, N_SCRATCH, N_SLOTS, NAME_PREFIX, decode_entries};
use crate::{ChatRequest, FirstMove, LlmError};
use llama_cpp_2::token::LlamaToken;
use std::time::Instant;

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

impl<'m> Engine<'m> {
    /// Exact first-move probabilities; see [`crate::local`] for what is scored.
    pub(super) fn score(
        &mut self,
        req: &ChatRequest,
        candidates: &[String],
    ) -> Result<FirstMove, LlmError> {
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

    /// Clears the first `n` scoring scratch sequences.
    fn clear_scratch(&mut self, n: usize) -> Result<(), LlmError> {
        for s in N_SLOTS + 1..=N_SLOTS + n {
            self.ctx
                .clear_kv_cache_seq(Some(s as u32), None, None)
                .map_err(|e| self.err(format!("clearing sequence {s}: {e}")))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logsumexp_is_stable_and_exact_on_small_inputs() {
        let row = [0.0f32, 0.0, 1000.0];
        assert!((logsumexp(&row, None) - 1000.0).abs() < 1e-9);
        let two = [0.0f32, 0.0];
        assert!((logsumexp(&two, None) - 2f64.ln()).abs() < 1e-12);
        assert!((logsumexp(&row, Some(&[LlamaToken(0)])) - 0.0).abs() < 1e-12);
    }
}
